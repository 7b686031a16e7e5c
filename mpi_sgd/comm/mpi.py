"""The default backend: mpi4py's buffer methods on numpy views of torch tensors.

Every call hands MPI the tensor's own memory (see :mod:`mpi_sgd.comm.buffers`), so an
all-reduce here costs what ``comm.Allreduce(MPI.IN_PLACE, array)`` costs plus the view.
"avg" is MPI's SUM followed by an in-place division, since MPI has no average op.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from ..launch import env_flag
from .base import CollectiveMismatchError, Communicator, Request, check_op, split_counts
from .buffers import as_array, signature

_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}


def _mpi_op(op: str):
    try:
        return _MPI_OPS[op]
    except KeyError:
        check_op(op)  # raises with the list of valid ops
        raise


def _wait(handle) -> None:
    handle.Wait()


def _test(handle) -> bool:
    return handle.Test()


class MPIComm(Communicator):
    """A :class:`Communicator` over an ``mpi4py.MPI.Comm`` (``COMM_WORLD`` unless given one).

    With ``debug=True`` (or ``MPI_SGD_DEBUG=1``) every collective first compares what each rank
    passed (shape, dtype, op, root) and raises :class:`CollectiveMismatchError` on every rank if
    they differ, instead of letting MPI truncate, hang or reduce garbage. The check is bound in
    at construction, so with debug off the methods are the plain ones and cost nothing extra.
    """

    backend = "mpi4py"

    def __init__(self, comm: MPI.Comm | None = None, debug: bool | None = None):
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # Ranks that share memory form one "node"; MPI works this out the same way under
        # hydra, Open MPI's prterun and Slurm's srun, so no launcher variables are needed.
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        if env_flag("MPI_SGD_DEBUG") if debug is None else debug:
            _install_checks(self)

    def wtime(self) -> float:
        return MPI.Wtime()

    # -- point to point -------------------------------------------------------------------
    def send(self, buf, dest, tag=0):
        self.comm.Send(as_array(buf), dest, tag)

    def recv(self, buf, source, tag=0):
        self.comm.Recv(as_array(buf), source, tag)
        return buf

    def isend(self, buf, dest, tag=0):
        arr = as_array(buf)
        return Request(self.comm.Isend(arr, dest, tag), _wait, _test, keep=arr)

    def irecv(self, buf, source, tag=0):
        arr = as_array(buf)
        return Request(self.comm.Irecv(arr, source, tag), _wait, _test, keep=arr)

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, buf, op="sum"):
        arr = as_array(buf)
        if op == "avg":
            _check_avg(arr)
            self.comm.Allreduce(MPI.IN_PLACE, arr, MPI.SUM)
            _divide(arr, self.size)
        else:
            self.comm.Allreduce(MPI.IN_PLACE, arr, _mpi_op(op))
        return buf

    def iallreduce(self, buf, op="sum"):
        arr = as_array(buf)
        finish = None
        if op == "avg":
            _check_avg(arr)
            finish = lambda: _divide(arr, self.size)  # noqa: E731
        return Request(self.comm.Iallreduce(MPI.IN_PLACE, arr, _mpi_op(op)), _wait, _test, finish, keep=arr)

    def broadcast(self, buf, root=0):
        self.comm.Bcast(as_array(buf), root)
        return buf

    def reduce(self, buf, op="sum", root=0):
        arr = as_array(buf)
        if op == "avg":
            _check_avg(arr)
        if self.rank == root:
            self.comm.Reduce(MPI.IN_PLACE, arr, _mpi_op(op), root)
            if op == "avg":
                _divide(arr, self.size)
        else:
            self.comm.Reduce(arr, None, _mpi_op(op), root)
        return buf

    def gather(self, sendbuf, recvbuf=None, root=0):
        recv = as_array(recvbuf) if self.rank == root else None
        self.comm.Gather(as_array(sendbuf), recv, root)
        return recvbuf

    def allgather(self, sendbuf, recvbuf):
        self.comm.Allgather(as_array(sendbuf), as_array(recvbuf))
        return recvbuf

    def scatter(self, sendbuf, recvbuf, root=0):
        send = as_array(sendbuf) if self.rank == root else None
        self.comm.Scatter(send, as_array(recvbuf), root)
        return recvbuf

    def reduce_scatter(self, sendbuf, recvbuf, counts: Sequence[int] | None = None, op="sum"):
        send, recv = as_array(sendbuf).reshape(-1), as_array(recvbuf).reshape(-1)
        counts = list(counts) if counts is not None else split_counts(send.size, self.size)
        if op == "avg":
            _check_avg(recv)
        self.comm.Reduce_scatter(send, recv, counts, _mpi_op(op))
        if op == "avg":
            _divide(recv, self.size)
        return recvbuf

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


def _check_avg(arr: np.ndarray) -> None:
    # Checked before communicating, so a bad call leaves every buffer untouched.
    if arr.dtype.kind not in "fc":
        raise TypeError(f"op 'avg' needs a floating dtype, got {arr.dtype}; use 'sum' and divide yourself")


def _divide(arr: np.ndarray, n: int) -> None:
    arr /= n


# -- debug mode: agree on the call before making it ---------------------------------------
_CHECKED = {
    # method name -> function giving what every rank must agree on
    "allreduce": lambda buf, op="sum": (signature(buf), op),
    "iallreduce": lambda buf, op="sum": (signature(buf), op),
    "broadcast": lambda buf, root=0: (signature(buf), root),
    "reduce": lambda buf, op="sum", root=0: (signature(buf), op, root),
    "allgather": lambda sendbuf, recvbuf: (signature(sendbuf), signature(recvbuf)),
    "gather": lambda sendbuf, recvbuf=None, root=0: (signature(sendbuf), root),
    "scatter": lambda sendbuf, recvbuf, root=0: (signature(recvbuf), root),
    "reduce_scatter": lambda sendbuf, recvbuf, counts=None, op="sum": (
        signature(sendbuf),
        None if counts is None else tuple(counts),
        op,
    ),
}


def _install_checks(comm: MPIComm) -> None:
    for name, describe in _CHECKED.items():
        plain = getattr(comm, name)
        setattr(comm, name, _checked(comm, name, plain, describe))


def _checked(comm: MPIComm, name, plain, describe):
    def call(*args, **kwargs):
        mine = describe(*args, **kwargs)
        everyone = comm.comm.allgather(mine)  # a collective every rank makes, so none hangs
        if any(sig != everyone[0] for sig in everyone):
            lines = "\n".join(f"  rank {r}: {sig}" for r, sig in enumerate(everyone))
            raise CollectiveMismatchError(
                f"ranks called {name} with different arguments (shape/dtype, op, root):\n{lines}"
            )
        return plain(*args, **kwargs)

    call.__name__ = name
    return call
