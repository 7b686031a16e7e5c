"""A communicator that wraps another and changes one thing (the shape of a cross-cutting concern).

Subclasses override the methods their concern touches; everything else reaches ``inner`` as it is.
"""

from __future__ import annotations

from typing import Any

from .base import Communicator


class CommWrapper(Communicator):
    """Delegates the whole seam to ``inner``."""

    def __init__(self, inner: Communicator):
        self.inner = inner

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

    def __getattr__(self, name: str) -> Any:  # a backend's own attributes (comm, device, group)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def wtime(self):
        return self.inner.wtime()

    def send(self, buf, dest, tag=0):
        return self.inner.send(buf, dest, tag)

    def recv(self, buf, source, tag=0):
        return self.inner.recv(buf, source, tag)

    def isend(self, buf, dest, tag=0):
        return self.inner.isend(buf, dest, tag)

    def irecv(self, buf, source, tag=0):
        return self.inner.irecv(buf, source, tag)

    def allreduce(self, buf, op="sum"):
        return self.inner.allreduce(buf, op)

    def iallreduce(self, buf, op="sum"):
        return self.inner.iallreduce(buf, op)

    def broadcast(self, buf, root=0):
        return self.inner.broadcast(buf, root)

    def reduce(self, buf, op="sum", root=0):
        return self.inner.reduce(buf, op, root)

    def gather(self, sendbuf, recvbuf=None, root=0):
        return self.inner.gather(sendbuf, recvbuf, root)

    def allgather(self, sendbuf, recvbuf):
        return self.inner.allgather(sendbuf, recvbuf)

    def scatter(self, sendbuf, recvbuf, root=0):
        return self.inner.scatter(sendbuf, recvbuf, root)

    def reduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        return self.inner.reduce_scatter(sendbuf, recvbuf, counts, op)

    def barrier(self):
        return self.inner.barrier()

    def abort(self, code=1):
        return self.inner.abort(code)

    def bcast_obj(self, obj, root=0):
        return self.inner.bcast_obj(obj, root)

    def allgather_obj(self, obj):
        return self.inner.allgather_obj(obj)

    def gather_obj(self, obj, root=0):
        return self.inner.gather_obj(obj, root)
