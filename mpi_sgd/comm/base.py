"""The communicator seam: the one interface every backend implements.

Everything above this layer (examples, collectives built from point-to-point, gradient
synchronisation, the trainer, the benchmarks) talks to a :class:`Communicator` that it is
handed explicitly. The package is laid out by role:

* ``backends/`` implement the seam: :class:`~mpi_sgd.comm.backends.mpi.MPIComm` (mpi4py's buffer
  methods, zero-copy on contiguous CPU tensors and numpy arrays; the default),
  :class:`~mpi_sgd.comm.backends.torch_dist.TorchDistComm` (``torch.distributed`` with the mpi,
  gloo or nccl backend, or torch over this project's own ``"mpi4py"`` process group,
  :mod:`~mpi_sgd.comm.backends.torch_mpi4py`) and :class:`~mpi_sgd.comm.backends.local.LocalComm`
  (world size 1, so ``python script.py`` runs the same code as ``mpiexec -n 4 python script.py``).
* ``wrappers/`` hold the concerns that apply to every backend alike, each a
  :class:`~mpi_sgd.comm.wrappers.wrapper.CommWrapper` around any communicator: debug-mode argument
  checks, the stall watchdog, fault injection, byte counting, 16-bit compression, GPU staging.
* ``shm/`` is the all-reduce of buffers in memory shared by the ranks of a node, which the mpi4py
  backend takes for buffers from :meth:`Communicator.alloc_shared`.

Buffer conventions (the same on every backend):

* ``allreduce``/``iallreduce``/``broadcast``/``reduce`` work **in place** on ``buf`` and return it.
* ``gather``/``allgather`` fill ``recvbuf`` whose first dimension is ``size`` (one slot per
  rank); ``scatter`` sends slot ``i`` of the root's ``sendbuf`` to rank ``i``.
* ``reduce_scatter`` reduces ``sendbuf`` (length ``sum(counts)``, flattened) across ranks and
  leaves segment ``rank`` in ``recvbuf``; ``counts`` defaults to an equal split.
* ``iallreduce``, ``ireduce_scatter`` and ``iallgather`` start the same operations and return a
  :class:`Request`; the buffers must not be touched until it completes.

Sub-communicators: :meth:`Communicator.split` and :meth:`Communicator.split_type` cut a communicator
into parts as ``MPI_Comm_split`` and ``MPI_Comm_split_type`` do, on every backend; a wrapper splits
what it wraps and wraps each part the same way (:mod:`.wrappers.wrapper`).

Why one module of over 300 lines: this is the seam every backend and wrapper implements, and most of
it is the contract in words (each call's docstring); the code under them is short.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .errors import CollectiveMismatchError, CommError
from .split import SPLIT_TYPES, check_split_type, split_table

OPS = ("sum", "avg", "min", "max", "prod")
# Wildcards for probe/iprobe: a message from any rank, with any tag (MPI_ANY_SOURCE, MPI_ANY_TAG).
ANY_SOURCE = -1
ANY_TAG = -1

__all__ = ["SPLIT_TYPES", "CollectiveMismatchError", "CommError"]  # from errors.py and split.py: the seam's too


class Status(NamedTuple):
    """What a probe found: who sent it, its tag, and how many elements of the asked dtype it holds."""

    source: int
    tag: int
    count: int


def check_op(op: str) -> str:
    if op not in OPS:
        raise ValueError(f"unknown reduction op {op!r}; choose one of {', '.join(OPS)}")
    return op


def check_avg(buf) -> None:
    """'avg' divides by the world size, so it needs a floating dtype (torch or numpy buffer).

    Every backend checks before communicating, so a bad call leaves every buffer untouched.
    """
    dtype = buf.dtype
    floating = dtype.is_floating_point if hasattr(dtype, "is_floating_point") else dtype.kind in "fc"
    if not floating:
        raise TypeError(f"op 'avg' needs a floating dtype, got {dtype}; use 'sum' and divide yourself")


def split_counts(n: int, parts: int) -> list[int]:
    """Split ``n`` items into ``parts`` contiguous segments whose sizes differ by at most one.

    The first ``n % parts`` segments get the extra item, as ``numpy.array_split`` does, so any
    length works at any world size, including ``n < parts`` (trailing segments are empty).
    """
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def element_count(nbytes: int, dtype) -> int:
    """How many elements of ``dtype`` (torch, numpy, or None for bytes) ``nbytes`` bytes hold."""
    if dtype is None:
        return nbytes
    itemsize = getattr(dtype, "itemsize", None)  # a torch.dtype or numpy.dtype instance
    if not isinstance(itemsize, int):  # a numpy scalar type (np.float32) or a name ("float32")
        import numpy

        itemsize = numpy.dtype(dtype).itemsize
    if nbytes % itemsize:
        raise CommError(f"a message of {nbytes} bytes is not a whole number of {dtype} ({itemsize} bytes each)")
    return nbytes // itemsize


def displacements(counts: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


class Request:
    """A pending non-blocking operation.

    ``wait()`` blocks until it completes and then runs the finaliser (for example the division
    that turns a sum into an average), exactly once. The request also keeps the buffers it
    uses alive until then, since the transport reads and writes them behind Python's back.
    """

    __slots__ = ("_handle", "_wait", "_test", "_finish", "_keep", "_done")

    def __init__(
        self,
        handle: Any,
        wait: Callable[[Any], None],
        test: Callable[[Any], bool],
        finish: Callable[[], None] | None = None,
        keep: Any = None,
    ):
        self._handle, self._wait, self._test = handle, wait, test
        self._finish, self._keep, self._done = finish, keep, False

    @classmethod
    def completed(cls, finish: Callable[[], None] | None = None) -> Request:
        """A request that is already done (size-1 worlds and blocking fallbacks)."""
        return cls(None, lambda h: None, lambda h: True, finish)

    def _complete(self) -> None:
        self._done = True
        if self._finish is not None:
            self._finish()
        self._handle = self._keep = self._finish = None

    def wait(self) -> None:
        if not self._done:
            self._wait(self._handle)
            self._complete()

    def test(self) -> bool:
        """Poll once without blocking. Polling also drives MPI's progress engine."""
        if not self._done and self._test(self._handle):
            self._complete()
        return self._done


class Communicator(abc.ABC):
    """The seam. Subclasses set ``rank``, ``size``, ``local_rank``, ``local_size`` and ``backend``."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    backend: str

    # Whether alloc_shared gives memory the ranks of a node share (and all-reduce takes a faster
    # path on it): the same value on every rank. Strategies use it to decide where buckets live.
    node_shared: bool = False

    @property
    def is_root(self) -> bool:
        """Rank 0: the one rank that logs, draws progress bars and writes checkpoints."""
        return self.rank == 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} backend={self.backend} rank={self.rank}/{self.size}>"

    # -- point to point -------------------------------------------------------------------
    @abc.abstractmethod
    def send(self, buf, dest: int, tag: int = 0) -> None: ...

    @abc.abstractmethod
    def recv(self, buf, source: int, tag: int = 0): ...

    @abc.abstractmethod
    def isend(self, buf, dest: int, tag: int = 0) -> Request: ...

    @abc.abstractmethod
    def irecv(self, buf, source: int, tag: int = 0) -> Request: ...

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, dtype=None) -> Status | None:
        """The next message that a receive from ``source`` with ``tag`` would match, or None.

        Nothing is received: the message stays queued for a ``recv`` from ``Status.source``.
        ``Status.count`` is in elements of ``dtype`` (a torch or numpy dtype; bytes if None).
        Only point-to-point backends over MPI (and the size-1 one) have this; with it a rank can
        serve whoever speaks first, as a parameter server does.
        """
        raise CommError(f"the {self.backend} backend has no probe; serving messages from any source needs mpi4py")

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, dtype=None) -> Status:
        """:meth:`iprobe` that waits until such a message is there."""
        raise CommError(f"the {self.backend} backend has no probe; serving messages from any source needs mpi4py")

    # -- collectives ----------------------------------------------------------------------
    @abc.abstractmethod
    def allreduce(self, buf, op: str = "sum"): ...

    @abc.abstractmethod
    def iallreduce(self, buf, op: str = "sum") -> Request: ...

    @abc.abstractmethod
    def broadcast(self, buf, root: int = 0): ...

    @abc.abstractmethod
    def reduce(self, buf, op: str = "sum", root: int = 0): ...

    @abc.abstractmethod
    def gather(self, sendbuf, recvbuf=None, root: int = 0): ...

    @abc.abstractmethod
    def allgather(self, sendbuf, recvbuf): ...

    @abc.abstractmethod
    def scatter(self, sendbuf, recvbuf, root: int = 0): ...

    @abc.abstractmethod
    def reduce_scatter(self, sendbuf, recvbuf, counts: Sequence[int] | None = None, op: str = "sum"): ...

    # Non-blocking forms of reduce_scatter and allgather, for overlapping them with computation
    # (sharded data parallel). A backend without them runs the blocking call: correct, no overlap.
    def ireduce_scatter(self, sendbuf, recvbuf, counts: Sequence[int] | None = None, op: str = "sum") -> Request:
        self.reduce_scatter(sendbuf, recvbuf, counts, op)
        return Request.completed()

    def iallgather(self, sendbuf, recvbuf) -> Request:
        self.allgather(sendbuf, recvbuf)
        return Request.completed()

    @abc.abstractmethod
    def barrier(self) -> None: ...

    def ibarrier(self) -> Request:
        """A barrier to wait for by polling: the ranks that arrive early can sleep between polls
        (:func:`~mpi_sgd.comm.polling.wait_idle`) instead of spinning in a blocking call. A backend
        without one runs the blocking barrier."""
        self.barrier()
        return Request.completed()

    @abc.abstractmethod
    def abort(self, code: int = 1) -> None:
        """End every rank of the job now, those outside this communicator too (a sub-communicator's
        abort ends the whole job). Used when one rank fails so the others do not hang."""

    # -- sub-communicators -----------------------------------------------------------------
    @abc.abstractmethod
    def split(self, color: int | None, key: int | None = None) -> Communicator | None:
        """This rank's part of the communicator cut by ``color``, as ``MPI_Comm_split`` cuts it.

        **Collective over this communicator**: every rank calls it, at the same point. Ranks that
        pass the same ``color`` (a whole number, 0 or more) form one sub-communicator, in which
        they are numbered by ``key`` and then by their rank here (``key`` defaults to that rank,
        which keeps their order); a rank that passes ``None`` (MPI_UNDEFINED) takes part and gets
        None. Colors need not be consecutive and parts may differ in size; a part of one rank is
        an ordinary world of one. Each sub-communicator is a new communication context: its
        messages never meet this one's. It has the same backend as this one; around a wrapped
        communicator, each part is wrapped with the same wrappers and settings
        (:meth:`~mpi_sgd.comm.wrappers.wrapper.CommWrapper.split`). A bad color or key on any rank
        raises ``ValueError`` on every rank, naming it, before any part is made.
        """

    @abc.abstractmethod
    def split_type(self, kind: str = "node", key: int | None = None) -> Communicator:
        """The ranks of this communicator that share this rank's node (memory), as
        ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``; ordered by ``key``, then rank (:meth:`split`).

        Collective over this communicator, like :meth:`split`. ``kind`` is ``"node"``, the one kind
        in :data:`SPLIT_TYPES`; its ``local_rank`` and ``local_size`` are its rank and size.
        """

    def _agree_split(self, color, key) -> dict[int, list[int]]:
        """Every rank's color and key, judged alike on every rank (:func:`split_table`)."""
        return split_table(self.allgather_obj((color, self.rank if key is None else key)))

    def _agree_split_type(self, kind, key) -> int:
        """Every rank's kind and key, judged alike on every rank; returns this rank's key."""
        key = self.rank if key is None else key
        check_split_type(self.allgather_obj((kind, key)))
        return key

    # -- small Python objects (pickled; for metadata, never for tensors on a hot path) -----
    @abc.abstractmethod
    def bcast_obj(self, obj: Any, root: int = 0) -> Any: ...

    @abc.abstractmethod
    def allgather_obj(self, obj: Any) -> list: ...

    def gather_obj(self, obj: Any, root: int = 0) -> list | None:
        """Objects from every rank on ``root`` (``None`` elsewhere)."""
        objs = self.allgather_obj(obj)
        return objs if self.rank == root else None

    def alloc_shared(self, n: int, dtype=None):
        """A zeroed 1-D tensor of ``n`` elements that this communicator all-reduces fastest.

        Collective: every rank calls it with the same ``n`` and ``dtype`` (default float32). The
        mpi4py backend places it in a window shared by the ranks of a node (see
        :mod:`mpi_sgd.comm.shm.window`); this default is an ordinary buffer, so every backend takes it.
        """
        from .buffers import zeros

        return zeros(n, dtype)

    def where(self, phase: str, step: int | None = None) -> None:
        """Say what this rank is doing ("forward", and the training step when it changes).

        Nothing here; wrappers listen: the watchdog names it when a peer waits for this rank, and
        fault injection picks its moment by it. Cheap enough to call a few times per step.
        """
        return None

    def close(self) -> None:
        """Free what this communicator made (collective: every rank calls it, in the same order).

        Nothing here. The mpi4py backend frees its node-shared windows and, for a part made by
        :meth:`split`, the part itself; a wrapper frees what it made (a duplicate, a thread) and
        closes the communicator it wraps if it made that too (:func:`mpi_sgd.comm.init`'s stack,
        a split's parts). Neither the communicator nor a buffer from :meth:`alloc_shared` may be
        used after it. A job that ends without it loses nothing (``MPI_Finalize`` frees it all);
        a process that makes communicators in a loop runs out of them without it, as MPI allows
        each process only so many (a few thousand under MPICH).
        """
        return None

    def wtime(self) -> float:
        """Wall-clock seconds, the clock benchmarks read (``MPI.Wtime`` where MPI is up)."""
        import time

        return time.perf_counter()
