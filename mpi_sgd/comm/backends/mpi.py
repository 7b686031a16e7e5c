"""The default backend: mpi4py's buffer methods on the tensors' own memory.

A contiguous CPU tensor goes to MPI as (address, MPI datatype), which mpi4py takes as it is: the
cheapest of the ways in, cheaper than a ``.numpy()`` view and far cheaper than the DLPack protocol
mpi4py would use on the tensor itself (``mpi-sgd bench allreduce`` shows the seam's per-call cost
against raw mpi4py). bfloat16 (and float16 where MPI lacks it) travel the same way, reduced by
user-defined ops (:mod:`.mpitypes`). A CUDA tensor does too when the MPI library is CUDA-aware
(:func:`mpi_sgd.comm.gpu.cuda_aware`), after its stream is synchronised; otherwise ``init`` stages GPU tensors
through host memory. Everything else (numpy arrays; tensors that fail a check, which then get the
error that says why) goes through :func:`mpi_sgd.comm.buffers.as_array`. "avg" is MPI's SUM
followed by an in-place division, since MPI has no average op.

Why one module of over 300 lines: it is one class that implements the whole seam, a few lines a
call; split, one backend would be read in two places.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from mpi4py import MPI

from .. import gpu
from ..base import (
    ANY_SOURCE,
    ANY_TAG,
    Communicator,
    Request,
    Status,
    check_avg,
    check_op,
    element_count,
    split_counts,
)
from ..buffers import as_array
from . import bufplan, mpitypes

# Bound once: the all-reduce's hot path is short enough that module attribute lookups show.
_Tensor, _IN_PLACE, _plan = torch.Tensor, MPI.IN_PLACE, bufplan.plan
_NUMPY_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}


def _spec(buf):
    """What mpi4py's buffer methods take for ``buf``, sharing its memory: a contiguous CPU tensor
    (exactly a ``torch.Tensor``: a Parameter requires grad) by address and MPI datatype, worked out
    once per tensor (:mod:`.bufplan`); a CUDA tensor the same way where MPI is CUDA-aware, after
    the kernels writing it are done (MPI reads memory outside CUDA's streams). The buffer object
    holds no reference to the tensor, so non-blocking calls keep ``buf`` in their Request."""
    if type(buf) is torch.Tensor:
        found = bufplan.plan(buf)
        if found is not None:
            return found.spec
        mpitype = mpitypes.datatype(buf.dtype)
        if mpitype is not None and buf.is_cuda and gpu.cuda_aware() and not buf.requires_grad and buf.is_contiguous():
            gpu.sync(buf)
            return mpitypes.buffer(buf)
    return as_array(buf)


def _mpi_op(op: str, buf):
    """MPI's op for ``op`` on ``buf``'s dtype (a user-defined one for the 16-bit floats; a logical
    one for booleans, numpy's as torch's: MPI defines no sum of C_BOOL)."""
    check_op(op)  # raises with the list of valid ops
    if isinstance(buf, torch.Tensor):
        return mpitypes.reduce_op(op, buf.dtype)
    return mpitypes.reduce_op(op, torch.bool) if buf.dtype == bool else _NUMPY_OPS[op]


def _wildcard(value: int, mpi_value: int) -> int:
    # The seam's ANY_SOURCE/ANY_TAG are -1 everywhere; MPI's own values differ between libraries.
    return mpi_value if value == ANY_SOURCE else value


_wait, _test = MPI.Request.Wait, MPI.Request.Test  # what a Request calls on its MPI handle


def _clear_residue(node: MPI.Comm) -> None:
    """Leave nothing in /dev/shm if this job is killed (MPICH's start-up segment unlinked once the
    node's ranks map it), and remove what killed jobs left (:mod:`mpi_sgd.cluster.residue`): segments
    no process maps any more and killed Open MPI launchers' session directories, by the node's first rank."""
    from ...cluster import residue
    from ..shm.window import unlink_mpi_segments

    unlink_mpi_segments(node)
    if node.Get_rank() == 0:
        residue.clean()
        residue.clean_sessions()


class MPIComm(Communicator):
    """A :class:`Communicator` over an ``mpi4py.MPI.Comm`` (``COMM_WORLD`` unless given one).

    Arguments are not compared across ranks here; wrap it in
    :class:`~mpi_sgd.comm.wrappers.checked.CheckedComm` for that (``init(debug=True)``).
    """

    backend = "mpi4py"

    def __init__(self, comm: MPI.Comm | None = None, node_size: int | None = None, owns: bool = False):
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self._owns_comm = owns  # whether close() frees it: a part split() made, not the world or a caller's
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        # Ranks that share memory form one "node"; MPI works this out the same way under
        # hydra, Open MPI's prterun and Slurm's srun, so no launcher variables are needed.
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        if comm is None:
            _clear_residue(node)
        node.Free()
        self._init_shared(node_size)

    def wtime(self) -> float:
        return MPI.Wtime()

    # -- point to point -------------------------------------------------------------------
    def send(self, buf, dest, tag=0):
        self.comm.Send(_spec(buf), dest, tag)

    def recv(self, buf, source, tag=0):
        self.comm.Recv(_spec(buf), source, tag)
        return buf

    def isend(self, buf, dest, tag=0):
        return Request(self.comm.Isend(_spec(buf), dest, tag), _wait, _test, keep=buf)

    def irecv(self, buf, source, tag=0):
        return Request(self.comm.Irecv(_spec(buf), source, tag), _wait, _test, keep=buf)

    def iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, dtype=None):
        status = MPI.Status()
        if not self.comm.Iprobe(_wildcard(source, MPI.ANY_SOURCE), _wildcard(tag, MPI.ANY_TAG), status):
            return None
        return Status(status.Get_source(), status.Get_tag(), element_count(status.Get_count(MPI.BYTE), dtype))

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG, dtype=None):
        status = MPI.Status()
        self.comm.Probe(_wildcard(source, MPI.ANY_SOURCE), _wildcard(tag, MPI.ANY_TAG), status)
        return Status(status.Get_source(), status.Get_tag(), element_count(status.Get_count(MPI.BYTE), dtype))

    # -- node-shared buffers: the all-reduce of comm/shm/allreduce.py ----------------------
    def _init_shared(self, node_size: int | None) -> None:
        from ..shm.settings import node_size_override, timeout_setting

        timeout_setting()  # a bad MPI_SGD_SHM_TIMEOUT fails here, on every rank, not at the first bucket
        # Windows come at the first alloc_shared; whether a node has two ranks to share is known now, alike everywhere.
        self._shm, self._node_size = None, node_size_override(node_size)
        mine = self.local_size if self._node_size is None else min(self.local_size, self._node_size)
        self.node_shared = self.comm.allreduce(mine, op=MPI.MAX) > 1

    def alloc_shared(self, n, dtype=None):
        if self._shm is None:
            from ..shm.allreduce import SharedAllreduce

            self._shm = SharedAllreduce(self.comm, self._node_size)
        return self._shm.alloc(n, dtype)

    @property
    def one_node(self) -> bool:
        """Whether every rank of this communicator shares one host's memory (and no pretend node
        size, ``MPI_SGD_SHM_NODE_SIZE``, cuts them apart): then ranks can meet in shared memory."""
        return self.local_size == self.size and (self._node_size is None or self._node_size >= self.size)

    def checks_own_calls(self, buf) -> bool:
        """Whether an all-reduce of ``buf`` compares the ranks' arguments itself: the node-shared
        all-reduce does, before it reads anything (:mod:`mpi_sgd.comm.shm.stages`)."""
        shm = self._shm  # asked by the per-call check on every call: small buffers leave at once
        if shm is None or getattr(buf, "nbytes", 0) < shm.min_bytes:
            return False
        plan = _plan(buf) if type(buf) is _Tensor else None
        return (shm.find(buf) if plan is None else self._in_window(plan)) is not None

    # -- collectives ----------------------------------------------------------------------
    def _in_window(self, plan):
        """Where a planned tensor (:mod:`.bufplan`) lies among the buffers the node-shared
        all-reduce takes; None sends it to MPI."""
        shm = self._shm
        return None if shm is None or plan.nbytes < shm.min_bytes else shm.takes(bufplan.lookup(plan, shm.mem))

    def allreduce(self, buf, op="sum"):
        # A plain CPU tensor is decided with one look (its plan); the rest takes the general path.
        if type(buf) is _Tensor and (plan := _plan(buf)) is not None:
            if (found := self._in_window(plan)) is not None:
                self._shm.allreduce(found, op)
                return buf
            if op != "avg":
                self.comm.Allreduce(_IN_PLACE, plan.spec, plan.ops.get(op) or bufplan.op_for(plan, op))
                return buf
        elif self._shm is not None and (found := self._shm.find(buf)) is not None:
            self._shm.allreduce(found, op)
            return buf
        if op == "avg":
            check_avg(buf)
            self.comm.Allreduce(MPI.IN_PLACE, _spec(buf), _mpi_op(op, buf))  # bfloat16's sum is MPI's user op
            buf /= self.size
        else:
            self.comm.Allreduce(MPI.IN_PLACE, _spec(buf), _mpi_op(op, buf))
        return buf

    def iallreduce(self, buf, op="sum"):
        if type(buf) is _Tensor and (plan := _plan(buf)) is not None:
            if (found := self._in_window(plan)) is not None:
                return self._shm.iallreduce(found, op, keep=buf)
            if op != "avg":
                handle = self.comm.Iallreduce(_IN_PLACE, plan.spec, plan.ops.get(op) or bufplan.op_for(plan, op))
                return Request(handle, _wait, _test, keep=buf)
        elif self._shm is not None and (found := self._shm.find(buf)) is not None:
            return self._shm.iallreduce(found, op, keep=buf)
        finish = None
        if op == "avg":
            check_avg(buf)
            finish = lambda: buf.__itruediv__(self.size)  # noqa: E731
        return Request(self.comm.Iallreduce(MPI.IN_PLACE, _spec(buf), _mpi_op(op, buf)), _wait, _test, finish, keep=buf)

    def broadcast(self, buf, root=0):
        self.comm.Bcast(_spec(buf), root)
        return buf

    def reduce(self, buf, op="sum", root=0):
        if op == "avg":
            check_avg(buf)
        if self.rank == root:
            if mpitypes.OLD_MPICH:  # its in-place Reduce crashes (see mpitypes): from a copy instead
                mine = buf.clone() if isinstance(buf, torch.Tensor) else buf.copy()  # held here: _spec
                # names the memory without keeping the copy alive
                self.comm.Reduce(_spec(mine), _spec(buf), _mpi_op(op, buf), root)
            else:
                self.comm.Reduce(MPI.IN_PLACE, _spec(buf), _mpi_op(op, buf), root)
            if op == "avg":
                buf /= self.size
        else:
            self.comm.Reduce(_spec(buf), None, _mpi_op(op, buf), root)
        return buf

    def gather(self, sendbuf, recvbuf=None, root=0):
        recv = _spec(recvbuf) if self.rank == root else None
        self.comm.Gather(_spec(sendbuf), recv, root)
        return recvbuf

    def allgather(self, sendbuf, recvbuf):
        self.comm.Allgather(_spec(sendbuf), _spec(recvbuf))
        return recvbuf

    def scatter(self, sendbuf, recvbuf, root=0):
        send = _spec(sendbuf) if self.rank == root else None
        self.comm.Scatter(send, _spec(recvbuf), root)
        return recvbuf

    def reduce_scatter(self, sendbuf, recvbuf, counts: Sequence[int] | None = None, op="sum"):
        n = sendbuf.numel() if isinstance(sendbuf, torch.Tensor) else sendbuf.size
        counts = list(counts) if counts is not None else split_counts(n, self.size)
        if op == "avg":
            check_avg(recvbuf)
        self.comm.Reduce_scatter(_spec(sendbuf), _spec(recvbuf), counts, _mpi_op(op, sendbuf))
        if op == "avg":
            recvbuf /= self.size
        return recvbuf

    def ireduce_scatter(self, sendbuf, recvbuf, counts: Sequence[int] | None = None, op="sum"):
        n = sendbuf.numel() if isinstance(sendbuf, torch.Tensor) else sendbuf.size
        counts = list(counts) if counts is not None else split_counts(n, self.size)
        finish = None
        if op == "avg":
            check_avg(recvbuf)
            finish = lambda: recvbuf.__itruediv__(self.size)  # noqa: E731
        # _spec, as the blocking call: bfloat16 and float16 travel as MPI's user-defined ops take them
        handle = self.comm.Ireduce_scatter(_spec(sendbuf), _spec(recvbuf), counts, _mpi_op(op, sendbuf))
        return Request(handle, _wait, _test, finish, keep=(sendbuf, recvbuf))

    def iallgather(self, sendbuf, recvbuf):
        handle = self.comm.Iallgather(_spec(sendbuf), _spec(recvbuf))
        return Request(handle, _wait, _test, keep=(sendbuf, recvbuf))

    def barrier(self):
        self.comm.Barrier()

    def ibarrier(self):
        return Request(self.comm.Ibarrier(), _wait, _test)

    def abort(self, code=1):
        # The whole job, whatever this communicator spans: the standard promises only a best attempt
        # at the ranks of the communicator given (MPICH and Open MPI end the job today, as a choice).
        MPI.COMM_WORLD.Abort(code)

    # -- sub-communicators ----------------------------------------------------------------
    def split(self, color, key=None):
        self._agree_split(color, key)  # a bad color or key fails on every rank, before MPI's split
        part = self.comm.Split(MPI.UNDEFINED if color is None else color, self.rank if key is None else key)
        return None if color is None else MPIComm(part, self._node_size, owns=True)

    def split_type(self, kind="node", key=None):
        key = self._agree_split_type(kind, key)
        return MPIComm(self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=key), self._node_size, owns=True)

    def close(self):
        shm, self._shm = self._shm, None  # the node-shared all-reduce's windows
        if shm is not None:
            shm.close()
        if self._owns_comm and self.comm != MPI.COMM_NULL:  # Free() leaves the handle null: twice is harmless
            self.comm.Free()

    # -- objects --------------------------------------------------------------------------
    def bcast_obj(self, obj, root=0):
        return self.comm.bcast(obj, root)

    def allgather_obj(self, obj):
        return self.comm.allgather(obj)

    def gather_obj(self, obj, root=0):
        return self.comm.gather(obj, root)
