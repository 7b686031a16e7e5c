"""What the ``"mpi4py"`` process group refuses, before any communication, and why.

torch hands a process group whatever its caller passed. MPI can be handed a tensor's memory as it
is only if that memory is one strided CPU block of a dtype MPI has (:mod:`.mpitypes`), and a call
only if its ranks, roots, tags and per-rank lists fit the group. Everything else is refused here,
on the calling rank and before any request starts, with an error that names the call: a
``NotImplementedError`` for what the backend does not do (sparse or GPU tensors, NCCL's
``PREMUL_SUM``, several tensors per process), a ``ValueError`` or ``TypeError`` for a call that
cannot be right. :class:`GroupChecks` holds the checks that need the group's size or MPI's tag
bound; :class:`~.mpi4py_group.MPI4PyProcessGroup` is made of it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from mpi4py import MPI

from . import mpitypes

_R = dist.ReduceOp.RedOpType
OP_NAMES = {
    _R.SUM: "sum",
    _R.AVG: "avg",
    _R.PRODUCT: "prod",
    _R.MIN: "min",
    _R.MAX: "max",
    _R.BAND: "band",
    _R.BOR: "bor",
    _R.BXOR: "bxor",
}


def unsupported(call: str, what: str) -> NotImplementedError:
    return NotImplementedError(f"mpi4py backend: {call} does not support {what}")


def check(t: torch.Tensor, call: str) -> torch.Tensor:
    """Refuse, before any communication, what MPI cannot be handed as it is."""
    if t.layout != torch.strided:
        raise unsupported(call, f"{t.layout} tensors")
    if t.device.type != "cpu":
        raise unsupported(call, f"tensors on {t.device}; use the nccl backend for GPU tensors")
    if not t.is_contiguous():
        raise ValueError(f"mpi4py backend: {call} needs contiguous tensors, got strides {t.stride()}")
    if mpitypes.datatype(t.dtype) is None:
        raise unsupported(call, f"dtype {t.dtype}")
    return t


def single(tensors, call: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise unsupported(call, f"{len(tensors)} tensors in one call (one tensor per process)")
    return check(tensors[0], call)


class GroupChecks:
    """The checks of a group of ``self._size`` ranks whose tags reach ``self._tag_ub`` (set by the group)."""

    _size: int
    _tag_ub: int

    def _op(self, reduce_op, dtype: torch.dtype, call: str) -> tuple[str, MPI.Op]:
        kind = getattr(reduce_op, "op", reduce_op)
        name = OP_NAMES.get(kind)
        if name is None:
            raise unsupported(call, f"reduce op {kind}")
        if name == "avg" and not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"mpi4py backend: {call} with AVG needs a floating dtype, got {dtype}")
        try:
            return name, mpitypes.reduce_op(name, dtype)
        except TypeError as e:
            raise TypeError(f"mpi4py backend: {call}: {e}") from None

    def _slots(self, slots, like: torch.Tensor, call: str) -> list:
        """The per-rank tensors of gather/allgather/scatter: one per rank, each like ``like``."""
        if len(slots) != self._size:
            raise ValueError(f"mpi4py backend: {call} needs {self._size} tensors (one per rank), got {len(slots)}")
        for s in slots:
            check(s, call)
            if s.dtype != like.dtype or s.numel() != like.numel():
                raise ValueError(
                    f"mpi4py backend: {call}: every tensor must have {like.numel()} elements of {like.dtype}, "
                    f"got {s.numel()} of {s.dtype}"
                )
        return list(slots)

    def _root(self, root: int, call: str) -> int:
        if not 0 <= root < self._size:
            raise ValueError(f"mpi4py backend: {call}: root {root} is not a rank of this group of {self._size}")
        return root

    def _tag(self, tag: int, call: str) -> int:
        if not 0 <= tag <= self._tag_ub:
            raise ValueError(f"mpi4py backend: {call}: tag {tag} outside MPI's range 0..{self._tag_ub}")
        return tag

    @staticmethod
    def _pairs(call: str, outputs, inputs) -> list:
        if len(outputs) != len(inputs):
            raise ValueError(f"mpi4py backend: {call}: {len(outputs)} outputs for {len(inputs)} inputs")
        return list(zip(outputs, inputs, strict=True))
