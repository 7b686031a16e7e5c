"""The default backend: mpi4py's buffer methods on the tensors' own memory.

A contiguous CPU tensor goes to MPI as (address, MPI datatype), which mpi4py takes as it is: the
cheapest of the ways in, cheaper than a ``.numpy()`` view and far cheaper than the DLPack protocol
mpi4py would use on the tensor itself (``mpi-sgd bench allreduce`` shows the seam's per-call cost
against raw mpi4py). Everything else (numpy arrays; tensors that fail a check, which then get the error that says
why) goes through :func:`mpi_sgd.comm.buffers.as_array`. "avg" is MPI's SUM followed by an
in-place division, since MPI has no average op.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from mpi4py import MPI

from .base import (
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
from .buffers import as_array

_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}


def _mpi_types() -> dict:
    """torch dtype -> MPI datatype, for the dtypes this MPI library has (the numpy path's mapping)."""
    out = {}
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int16, torch.int32,
                  torch.int64, torch.bool, torch.complex64, torch.complex128):  # fmt: skip
        try:
            out[dtype] = MPI.Datatype.fromcode(torch.empty(0, dtype=dtype).numpy().dtype.char)
        except (KeyError, ValueError):
            pass  # not in this MPI (float16 in some): such tensors get as_array's explanation
    return out


_TORCH_TO_MPI = _mpi_types()
_fromaddress = MPI.buffer.fromaddress


def _spec(buf):
    """What mpi4py's buffer methods take for ``buf``, sharing its memory.

    The fast path checks exactly what ``as_array`` would (a plain CPU tensor, contiguous, not
    requiring grad, of a dtype MPI has) and then names the memory directly. The buffer object
    holds no reference to the tensor, so non-blocking calls keep ``buf`` in their Request.
    """
    if type(buf) is torch.Tensor:  # exactly: a Parameter takes the checked path (it requires grad)
        mpitype = _TORCH_TO_MPI.get(buf.dtype)
        if mpitype is not None and buf.is_cpu and not buf.requires_grad and buf.is_contiguous():
            # No count: mpi4py derives it from the byte length, and for the gathered side of
            # gather/allgather (the scattered side of scatter) splits it over the ranks, as it
            # does for arrays. An explicit count there would mean "per rank".
            return [_fromaddress(buf.data_ptr(), buf.numel() * buf.element_size()), mpitype]
    return as_array(buf)


def _mpi_op(op: str):
    try:
        return _MPI_OPS[op]
    except KeyError:
        check_op(op)  # raises with the list of valid ops
        raise


def _wildcard(value: int, mpi_value: int) -> int:
    # The seam's ANY_SOURCE/ANY_TAG are -1 everywhere; MPI's own values differ between libraries.
    return mpi_value if value == ANY_SOURCE else value


def _wait(handle) -> None:
    handle.Wait()


def _test(handle) -> bool:
    return handle.Test()


class MPIComm(Communicator):
    """A :class:`Communicator` over an ``mpi4py.MPI.Comm`` (``COMM_WORLD`` unless given one).

    Arguments are not compared across ranks here; wrap it in
    :class:`~mpi_sgd.comm.checked.CheckedComm` for that (``init(debug=True)``).
    """

    backend = "mpi4py"

    def __init__(self, comm: MPI.Comm | None = None):
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # Ranks that share memory form one "node"; MPI works this out the same way under
        # hydra, Open MPI's prterun and Slurm's srun, so no launcher variables are needed.
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()

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

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, buf, op="sum"):
        if op == "avg":
            check_avg(buf)
            self.comm.Allreduce(MPI.IN_PLACE, _spec(buf), MPI.SUM)
            buf /= self.size
        else:
            self.comm.Allreduce(MPI.IN_PLACE, _spec(buf), _mpi_op(op))
        return buf

    def iallreduce(self, buf, op="sum"):
        finish = None
        if op == "avg":
            check_avg(buf)
            finish = lambda: buf.__itruediv__(self.size)  # noqa: E731
        return Request(self.comm.Iallreduce(MPI.IN_PLACE, _spec(buf), _mpi_op(op)), _wait, _test, finish, keep=buf)

    def broadcast(self, buf, root=0):
        self.comm.Bcast(_spec(buf), root)
        return buf

    def reduce(self, buf, op="sum", root=0):
        if op == "avg":
            check_avg(buf)
        if self.rank == root:
            self.comm.Reduce(MPI.IN_PLACE, _spec(buf), _mpi_op(op), root)
            if op == "avg":
                buf /= self.size
        else:
            self.comm.Reduce(_spec(buf), None, _mpi_op(op), root)
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
        send, recv = as_array(sendbuf).reshape(-1), as_array(recvbuf).reshape(-1)
        counts = list(counts) if counts is not None else split_counts(send.size, self.size)
        if op == "avg":
            check_avg(recv)
        self.comm.Reduce_scatter(send, recv, counts, _mpi_op(op))
        if op == "avg":
            recv /= self.size
        return recvbuf

    def ireduce_scatter(self, sendbuf, recvbuf, counts: Sequence[int] | None = None, op="sum"):
        send, recv = as_array(sendbuf).reshape(-1), as_array(recvbuf).reshape(-1)
        counts = list(counts) if counts is not None else split_counts(send.size, self.size)
        finish = None
        if op == "avg":
            check_avg(recv)
            finish = lambda: recv.__itruediv__(self.size)  # noqa: E731
        handle = self.comm.Ireduce_scatter(send, recv, counts, _mpi_op(op))
        return Request(handle, _wait, _test, finish, keep=(sendbuf, recvbuf))

    def iallgather(self, sendbuf, recvbuf):
        handle = self.comm.Iallgather(_spec(sendbuf), _spec(recvbuf))
        return Request(handle, _wait, _test, keep=(sendbuf, recvbuf))

    def barrier(self):
        self.comm.Barrier()

    def abort(self, code=1):
        self.comm.Abort(code)

    # -- objects --------------------------------------------------------------------------
    def bcast_obj(self, obj, root=0):
        return self.comm.bcast(obj, root)

    def allgather_obj(self, obj):
        return self.comm.allgather(obj)

    def gather_obj(self, obj, root=0):
        return self.comm.gather(obj, root)
