"""A communicator that wraps another: the shape of every cross-cutting concern.

Checking arguments in debug mode, a stall watchdog, fault injection, counting bytes: each is one
concern that applies to every backend alike, so each is a :class:`CommWrapper` around whatever
communicator it is given, and the backends stay plain. Wrappers stack
(``Counting(Checked(MPIComm()))``) and can each be tested alone, around the size-1 backend.

How to write one::

    class CountingComm(CommWrapper):
        \"\"\"Counts the bytes this rank all-reduces.\"\"\"

        def __init__(self, inner):
            super().__init__(inner)
            self.bytes = 0

        def allreduce(self, buf, op="sum"):
            self.bytes += buf.numel() * buf.element_size()
            return self.inner.allreduce(buf, op)  # then do what the wrapped one does

Override only the methods the concern touches; everything else reaches ``self.inner``
unchanged: every method of the seam is delegated here explicitly (a test checks that none is
missing, so a method added to :class:`~mpi_sgd.comm.base.Communicator` must be added here too),
and any other attribute (``comm`` of an MPI backend, ``device`` or ``group`` of a torch one) is
looked up on the inner communicator.

**Sub-communicators keep their wrappers.** :meth:`CommWrapper.split` splits the wrapped
communicator and wraps the part with :meth:`CommWrapper._rewrap`, which by default builds the
wrapper again with the arguments it was built with, the part in place of ``inner``: the example
above needs nothing more, and its parts count bytes of their own. A wrapper overrides ``_rewrap``
only where a part must not simply start afresh with the same arguments (the watchdog gives each
part its own side channel and the job's rank numbers; fault injection shares one fault per
process). A test builds every wrapper in the library, splits it, and compares.

**What a wrapper makes, its close() frees**: a wrapper that makes a duplicate communicator or a
thread frees it in ``close()`` and then calls ``super().close()``, which closes ``inner`` where this
layer made it (:func:`~mpi_sgd.comm.init` marks its whole stack so, and a part's wrappers own the part).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from ..base import ANY_SOURCE, ANY_TAG, Communicator, Request, Status


class CommWrapper(Communicator):
    """Delegates the whole seam to ``inner``; subclasses override what their concern changes."""

    def __new__(cls, *args, **kwargs):
        # What the wrapper was built with, so that _rewrap can build it again around a part. Kept
        # here rather than in __init__ so that no subclass has to remember to pass it on.
        self = super().__new__(cls)
        self._built_with = (args, kwargs)
        return self

    # Whether this layer made ``inner`` (init() builds the whole stack, split() a part's), so that
    # closing it closes ``inner`` too; a wrapper put around a communicator held elsewhere leaves it open.
    owns_inner = False

    def __init__(self, inner: Communicator):
        self.inner = inner

    def close(self) -> None:
        if self.owns_inner:
            self.owns_inner = False  # twice is harmless
            self.inner.close()

    # -- sub-communicators ------------------------------------------------------------------
    def split(self, color: int | None, key: int | None = None) -> Communicator | None:
        part = self.inner.split(color, key)
        return None if part is None else _owning(self._rewrap(part))

    def split_type(self, kind: str = "node", key: int | None = None) -> Communicator:
        return _owning(self._rewrap(self.inner.split_type(kind, key)))

    def _rewrap(self, inner: Communicator) -> Communicator:
        """This wrapper around ``inner``, a part of the communicator it wraps, with the same settings.

        Collective over the part (a wrapper may communicate while it is built, as the watchdog does).
        """
        return self._rebuild(inner)

    def _rebuild(self, inner: Communicator, **changes) -> Communicator:
        """Build this wrapper's class again with the arguments this one was built with, ``inner``
        in place of the communicator it wraps, and any argument in ``changes`` replaced."""
        args, kwargs = getattr(self, "_built_with", ((), {}))
        bound = inspect.signature(type(self).__init__).bind(self, *args, **kwargs)
        _, wrapped = list(bound.signature.parameters)[:2]  # (self, inner): inner by whatever name
        bound.arguments.update({wrapped: inner, **changes})
        return type(self)(*bound.args[1:], **bound.kwargs)

    # Rank and size are the inner communicator's, read through so a wrapper never goes stale.
    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def size(self) -> int:
        return self.inner.size

    @property
    def local_rank(self) -> int:
        return self.inner.local_rank

    @property
    def local_size(self) -> int:
        return self.inner.local_size

    @property
    def backend(self) -> str:
        return self.inner.backend

    @property
    def node_shared(self) -> bool:
        # Read through: the base class's False would otherwise hide the inner backend's answer.
        return self.inner.node_shared

    def __getattr__(self, name: str) -> Any:
        # Called only for names this class lacks: a backend's own attributes (comm, device, group).
        if name == "inner":  # not set yet (during unpickling, say): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.inner!r}>"

    def wtime(self) -> float:
        return self.inner.wtime()

    def alloc_shared(self, n: int, dtype=None):
        return self.inner.alloc_shared(n, dtype)

    def where(self, phase: str, step: int | None = None) -> None:
        return self.inner.where(phase, step)

    # -- point to point -------------------------------------------------------------------
    def send(self, buf, dest: int, tag: int = 0) -> None:
        return self.inner.send(buf, dest, tag)

    def recv(self, buf, source: int, tag: int = 0):
        return self.inner.recv(buf, source, tag)

    def isend(self, buf, dest: int, tag: int = 0) -> Request:
        return self.inner.isend(buf, dest, tag)

    def irecv(self, buf, source: int, tag: int = 0) -> Request:
        return self.inner.irecv(buf, source, tag)

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, dtype=None) -> Status | None:
        return self.inner.iprobe(source, tag, dtype)

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, dtype=None) -> Status:
        return self.inner.probe(source, tag, dtype)

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, buf, op: str = "sum"):
        return self.inner.allreduce(buf, op)

    def iallreduce(self, buf, op: str = "sum") -> Request:
        return self.inner.iallreduce(buf, op)

    def broadcast(self, buf, root: int = 0):
        return self.inner.broadcast(buf, root)

    def reduce(self, buf, op: str = "sum", root: int = 0):
        return self.inner.reduce(buf, op, root)

    def gather(self, sendbuf, recvbuf=None, root: int = 0):
        return self.inner.gather(sendbuf, recvbuf, root)

    def allgather(self, sendbuf, recvbuf):
        return self.inner.allgather(sendbuf, recvbuf)

    def scatter(self, sendbuf, recvbuf, root: int = 0):
        return self.inner.scatter(sendbuf, recvbuf, root)

    def reduce_scatter(self, sendbuf, recvbuf, counts: Sequence[int] | None = None, op: str = "sum"):
        return self.inner.reduce_scatter(sendbuf, recvbuf, counts, op)

    def ireduce_scatter(self, sendbuf, recvbuf, counts: Sequence[int] | None = None, op: str = "sum") -> Request:
        return self.inner.ireduce_scatter(sendbuf, recvbuf, counts, op)

    def iallgather(self, sendbuf, recvbuf) -> Request:
        return self.inner.iallgather(sendbuf, recvbuf)

    def barrier(self) -> None:
        return self.inner.barrier()

    def ibarrier(self) -> Request:
        return self.inner.ibarrier()

    def abort(self, code: int = 1) -> None:
        return self.inner.abort(code)

    # -- objects --------------------------------------------------------------------------
    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        return self.inner.bcast_obj(obj, root)

    def allgather_obj(self, obj: Any) -> list:
        return self.inner.allgather_obj(obj)

    def gather_obj(self, obj: Any, root: int = 0) -> list | None:
        return self.inner.gather_obj(obj, root)


def _owning(part: CommWrapper) -> CommWrapper:
    """A part's wrapper, which closes the part it wraps when closed: nobody else holds that part."""
    part.owns_inner = True
    return part
