"""What a CPU tensor is to MPI, worked out once per tensor and kept while the tensor lives.

Handing a tensor to one of mpi4py's buffer methods means reading half a dozen of its properties
(its type, dtype, device, whether it requires grad, its contiguity, its address and length) and
looking up MPI's datatype and reduction op. Each read is a call into torch, so together they cost
about as much as MPI's own all-reduce of a few kilobytes between two ranks on one host
(``mpi-sgd bench allreduce`` puts the seam beside raw mpi4py). A training loop or a user's script
communicates the same few buffers over and over, so the answer is kept per tensor object.

A kept answer is trusted only for the same live tensor with the same address, byte length and
``requires_grad``: the properties of a tensor that can change in place (``resize_`` and ``set_``
move or resize its memory; ``requires_grad_`` makes it a tensor MPI must not write). Its dtype and
device cannot change in place. A weak reference tells the tensor from a newer one that was given
the id of a dead one, and drops the answer when the tensor dies. CUDA tensors are not kept: each
call must synchronise their stream first (:func:`mpi_sgd.comm.gpu.sync`).
"""

from __future__ import annotations

import weakref

import torch
from mpi4py import MPI

from ..base import check_op
from . import mpitypes


class _Plan:
    __slots__ = ("ref", "ptr", "nbytes", "spec", "dtype", "ops", "key", "mem", "where")

    def __init__(self, ref, ptr: int, nbytes: int, spec: list, dtype: torch.dtype, count: int):
        self.ref, self.ptr, self.nbytes, self.spec, self.dtype = ref, ptr, nbytes, spec, dtype
        self.ops: dict[str, MPI.Op] = {}
        self.key = (ptr, count, dtype)  # how the node-shared buffers are looked up (shm/window.py)
        self.mem = self.where = None  # the node-shared memory last looked in, and what it said


_plans: dict[int, _Plan] = {}


def _forget(key: int, ref) -> None:
    # Called as the tensor dies, before its id can be given to another object; the check keeps a
    # newer plan under the same id (made after a resize, say) from being dropped by an old ref.
    plan = _plans.get(key)
    if plan is not None and plan.ref is ref:
        del _plans[key]


def plan(buf: torch.Tensor) -> _Plan | None:
    """The kept plan for ``buf`` (exactly a ``torch.Tensor``), made now if need be; None when
    ``buf`` is not a contiguous CPU tensor MPI can take as it is (the caller then takes its
    checked path, which names what is wrong)."""
    found = _plans.get(id(buf))
    if (  # the same tensor, still laid out as planned: in place, t_(), .data = a view of another dtype
        found is not None  # and resize_() each change one of these
        and found.ref() is buf
        and buf.data_ptr() == found.ptr
        and buf.nbytes == found.nbytes
        and buf.dtype is found.dtype
        and not buf.requires_grad
        and buf.is_contiguous()
    ):
        return found
    mpitype = mpitypes.datatype(buf.dtype)
    if mpitype is None or not buf.is_cpu or buf.requires_grad or not buf.is_contiguous():
        return None
    key = id(buf)
    ref = weakref.ref(buf, lambda r, key=key: _forget(key, r))
    made = _plans[key] = _Plan(ref, buf.data_ptr(), buf.nbytes, mpitypes.buffer(buf), buf.dtype, buf.numel())
    return made


def op_for(found: _Plan, op: str) -> MPI.Op:
    """MPI's op for ``op`` on the plan's dtype, looked up once per (tensor, op)."""
    mop = found.ops.get(op)
    if mop is None:
        check_op(op)  # raises with the list of valid ops
        mop = found.ops[op] = mpitypes.reduce_op(op, found.dtype)
    return mop


def lookup(found: _Plan, mem):
    """``mem.find_key`` for the plan's memory (``mem`` a node-shared
    :class:`~mpi_sgd.comm.shm.window.NodeMemory`), remembered: while the plan holds, its memory is
    the live tensor's own, which either lies in one of ``mem``'s windows (kept alive by the tensor)
    or outside all of them (no window made later can lie in live memory), so the answer stands."""
    if found.mem is not mem:
        found.mem, found.where = mem, mem.find_key(found.key)
    return found.where


def kept() -> int:
    """How many plans are kept (one per live tensor that was communicated): for the tests."""
    return len(_plans)
