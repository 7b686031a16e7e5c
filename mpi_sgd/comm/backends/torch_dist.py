"""``torch.distributed`` behind the same seam: the mpi, gloo and nccl backends.

Processes are still launched by ``mpiexec``; mpi4py tells each one its rank and world size
and carries the rendezvous (rank 0's address and a free port) to everyone, so no
``MASTER_ADDR``/``MASTER_PORT`` needs setting by hand. Where those variables are already set
(a torchrun launch) they are used as they are. Each communicator runs on a process group of its
own, never on torch's default group (see :class:`TorchDistComm`).

What each backend lacks is filled in here, and nowhere else:

* gloo and mpi have no "avg" op: SUM, then divide in place.
* gloo cannot message its own rank: such messages go through a local loopback.
* gloo has no reduce_scatter, and none of the backends has one with uneven segments: those
  fall back to an all-reduce of a copy and a slice (correct, but moves ``size`` times more data).
* The pip wheels of torch are built without the MPI backend; asking for it there fails with a
  message saying so (use ``mpi4py``, the default, ``torch-mpi4py`` or gloo).

``torch-mpi4py`` is torch.distributed over this project's own ``"mpi4py"`` process group
(:mod:`.torch_mpi4py`): MPI under the torch API, where the pip wheels have no ``"mpi"``. It has
an average op and reduce-scatter of its own, so neither needs filling in.
"""

from __future__ import annotations

import atexit
import datetime
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from ..base import CommError, Communicator, Request, check_avg, check_op, displacements, split_counts
from . import TORCH_BACKENDS, unavailable
from .local import Loopback
from .rendezvous import tcp_store
from .torch_groups import make_groups

TORCH_NAME = {"torch-mpi4py": "mpi4py"}  # seam backend -> torch.distributed backend, where they differ
NATIVE_AVG_AND_REDUCE_SCATTER = ("torch-mpi4py", "nccl")


# torch 2.13 renamed reduce_scatter_tensor (and warns on the old name); older releases have only that.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _t(buf):
    """numpy arrays travel as tensors sharing their memory."""
    return torch.from_numpy(buf) if isinstance(buf, np.ndarray) else buf


def _work_wait(work) -> None:
    work.wait()


def _work_test(work) -> bool:
    return work.is_completed()


class TorchDistComm(Communicator):
    """A :class:`Communicator` over a ``torch.distributed`` process group of its own.

    ``mpi`` is a communicator of the processes that take part: the world, or a split of it. It
    supplies rank, size and local rank, carries the rendezvous, and provides ``abort`` (torch has
    no job-wide abort) and the pickled-object calls.

    **Its own group.** torch.distributed keeps one default group per process, and every call
    made without ``group=`` goes there. Relying on it would let a second communicator (nccl
    beside gloo, a sub-group beside the world) silently run on the first one's group. So every
    ``TorchDistComm`` holds a group in ``self.group`` and passes it on every call: the first one
    in a process creates torch's default group (torch's rendezvous store lives there) and uses
    it; each later one makes a new group of its own backend over its own ranks with
    ``dist.new_group``, which only its members take part in (:mod:`.torch_groups` says how). That
    first communicator therefore decides which processes torch knows of: make it over every
    process that will use torch (the world), not over a part. Ranks here are ``mpi``'s.
    :meth:`split` makes the groups of every part at once, on every rank; ``group`` (with
    ``device``) is how a part is handed its own.
    """

    def __init__(
        self,
        backend: str,
        mpi: Communicator,
        timeout_s: float = 300.0,
        group: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
        owns_mpi: bool = False,
    ):
        if backend not in TORCH_BACKENDS:
            raise ValueError(f"unknown torch.distributed backend {backend!r}; choose one of {TORCH_BACKENDS}")
        if unavailable(backend):
            raise CommError(f"torch.distributed backend {backend!r} is not available: {unavailable(backend)}")
        self.backend = backend
        self.torch_backend = TORCH_NAME.get(backend, backend)
        self.mpi, self.owns_mpi = mpi, owns_mpi  # owned: made for it (by init or split), closed with it
        self.rank, self.size = mpi.rank, mpi.size
        self.local_rank, self.local_size = mpi.local_rank, mpi.local_size
        self._self = Loopback()
        self.timeout_s = timeout_s
        if device is None:  # a part keeps its parent's: local_rank counts only the part's ranks
            device = torch.device("cuda", self.local_rank) if backend == "nccl" else torch.device("cpu")
        self.device = device
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        if group is None:
            self.group = self._own_group(datetime.timedelta(seconds=timeout_s))
        else:
            self.group, self.torch_ranks = group, self.mpi.allgather_obj(dist.get_rank())

    def _own_group(self, timeout: datetime.timedelta):
        # Decided together: a rank that made the default group and one that did not would wait
        # in different calls for ever.
        ready = self.mpi.allgather_obj(dist.is_initialized())
        if not any(ready):
            self._init_default_group(timeout)
            return dist.group.WORLD
        if not all(ready):
            raise CommError(
                "some ranks of this communicator already use torch.distributed and others do not: "
                "make the first torch communicator over every process (the world), then sub-groups"
            )
        # torch's own numbering of this communicator's members, in our rank order: what dist.*
        # calls take as src, dst and root
        self.torch_ranks = self.mpi.allgather_obj(dist.get_rank())
        if len(set(self.torch_ranks)) != len(self.torch_ranks):  # all from the one torch world
            raise CommError(
                f"torch knows these ranks as {self.torch_ranks}: they must be distinct (make this communicator "
                "from the world the first torch communicator spans)"
            )
        return make_groups(self.mpi, self.torch_backend, [self.torch_ranks], timeout)[0]

    def _init_default_group(self, timeout: datetime.timedelta) -> None:
        self.torch_ranks = list(range(self.size))
        if self.backend == "mpi":  # torch's MPI backend reads rank and size from MPI itself
            dist.init_process_group("mpi", timeout=timeout)
            if dist.get_world_size() != self.size:
                raise CommError("torch's MPI backend spans the whole job: make it over the world communicator")
            return
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:  # a torchrun-style launch
            where = {"init_method": f"tcp://{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT'])}"}
        else:
            where = {"store": tcp_store(self.mpi.is_root, self.size, self.mpi.bcast_obj, timeout)}
        dist.init_process_group(self.torch_backend, rank=self.rank, world_size=self.size, timeout=timeout, **where)
        if self.backend == "nccl":
            # NCCL keeps communicators and threads that torch wants released before exit (it warns of
            # a leak otherwise); runs before mpi4py's MPI_Finalize, which was registered earlier.
            atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())

    def _reduce_op(self, op: str):
        check_op(op)
        if op == "avg":
            if self.backend in NATIVE_AVG_AND_REDUCE_SCATTER:
                return dist.ReduceOp.AVG
            return dist.ReduceOp.SUM
        return {
            "sum": dist.ReduceOp.SUM,
            "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX,
            "prod": dist.ReduceOp.PRODUCT,
        }[op]

    def _needs_divide(self, op: str, buf) -> bool:
        if op != "avg":
            return False
        check_avg(buf)
        return self.backend not in NATIVE_AVG_AND_REDUCE_SCATTER

    # -- point to point -------------------------------------------------------------------
    def send(self, buf, dest, tag=0):
        self.isend(buf, dest, tag).wait()

    def recv(self, buf, source, tag=0):
        self.irecv(buf, source, tag).wait()
        return buf

    def isend(self, buf, dest, tag=0):
        t = _t(buf)
        if dest == self.rank:
            return self._self.isend(t, tag)
        return Request(dist.isend(t, self.torch_ranks[dest], self.group, tag), _work_wait, _work_test, keep=t)

    def irecv(self, buf, source, tag=0):
        t = _t(buf)
        if source == self.rank:
            return self._self.irecv(t, tag)
        return Request(dist.irecv(t, self.torch_ranks[source], self.group, tag), _work_wait, _work_test, keep=t)

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, buf, op="sum"):
        t = _t(buf)
        divide = self._needs_divide(op, t)
        dist.all_reduce(t, self._reduce_op(op), self.group)
        if divide:
            t /= self.size
        return buf

    def iallreduce(self, buf, op="sum"):
        t = _t(buf)
        divide = self._needs_divide(op, t)
        work = dist.all_reduce(t, self._reduce_op(op), self.group, async_op=True)
        finish = (lambda: t.div_(self.size)) if divide else None
        return Request(work, _work_wait, _work_test, finish, keep=t)

    def broadcast(self, buf, root=0):
        dist.broadcast(_t(buf), self.torch_ranks[root], self.group)
        return buf

    def reduce(self, buf, op="sum", root=0):
        t = _t(buf)
        divide = self._needs_divide(op, t)
        dist.reduce(t, self.torch_ranks[root], self._reduce_op(op), self.group)
        if divide and self.rank == root:
            t /= self.size
        return buf

    def gather(self, sendbuf, recvbuf=None, root=0):
        slots = list(_t(recvbuf).unbind(0)) if self.rank == root else None
        dist.gather(_t(sendbuf), slots, self.torch_ranks[root], self.group)
        return recvbuf

    def allgather(self, sendbuf, recvbuf):
        dist.all_gather(list(_t(recvbuf).unbind(0)), _t(sendbuf), self.group)
        return recvbuf

    def scatter(self, sendbuf, recvbuf, root=0):
        slots = list(_t(sendbuf).unbind(0)) if self.rank == root else None
        dist.scatter(_t(recvbuf), slots, self.torch_ranks[root], self.group)
        return recvbuf

    def reduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        send, recv = _t(sendbuf).reshape(-1), _t(recvbuf).reshape(-1)
        counts = list(counts) if counts is not None else split_counts(send.numel(), self.size)
        if self.backend in NATIVE_AVG_AND_REDUCE_SCATTER and len(set(counts)) == 1:
            divide = self._needs_divide(op, recv)
            _reduce_scatter(recv, send, self._reduce_op(op), self.group)
            if divide:
                recv /= self.size
            return recvbuf
        total = send.clone()  # gloo/mpi, or uneven segments: all-reduce a copy, keep our slice
        self.allreduce(total, op)
        start = displacements(counts)[self.rank]
        recv.copy_(total[start : start + counts[self.rank]])
        return recvbuf

    def barrier(self):
        dist.barrier(self.group)

    def ibarrier(self):
        return self.mpi.ibarrier()  # over MPI, as the objects go: the same processes, no device to pick

    # -- sub-communicators: an MPI part for rank, size and objects, a torch group for the rest --
    def split(self, color, key=None):
        parts = self._agree_split(color, key)
        mpi = self.mpi.split(color, key)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        groups = make_groups(
            self.mpi, self.torch_backend, [[self.torch_ranks[r] for r in p] for p in parts.values()], timeout
        )
        if color is None:
            return None
        group = groups[list(parts).index(color)]
        return TorchDistComm(self.backend, mpi, self.timeout_s, group=group, device=self.device, owns_mpi=True)

    def split_type(self, kind="node", key=None):
        key = self._agree_split_type(kind, key)
        node = self.mpi.split_type(kind, key)
        lowest = min(node.allgather_obj(self.rank))  # a node is named by its lowest rank here
        node.close()
        return self.split(lowest, key)

    def close(self):
        """Shuts this communicator's process group down. The first one's is torch's default group:
        that is destroyed, and every group torch made after it with it (close that one last). A later
        one's group only shuts down, its connections and duplicates given back: torch names each new
        group after the number it knows (:mod:`.torch_groups`), so forgetting one would give the next
        the name, and the store's keys, of an old one. Then ``mpi``, where it was made for this."""
        group, self.group = self.group, None
        if group is not None and group == dist.group.WORLD:
            dist.destroy_process_group()
        elif group is not None:
            group.shutdown()
        if self.owns_mpi:
            self.owns_mpi = False
            self.mpi.close()

    def abort(self, code=1):
        self.mpi.abort(code)

    # -- objects --------------------------------------------------------------------------
    def bcast_obj(self, obj, root=0):
        return self.mpi.bcast_obj(obj, root)

    def allgather_obj(self, obj):
        return self.mpi.allgather_obj(obj)

    def wtime(self):
        if self.backend == "nccl":
            torch.cuda.synchronize()  # kernels are asynchronous: read the clock when they are done
        return time.perf_counter()
