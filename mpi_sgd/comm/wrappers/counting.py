"""A communicator that counts the bytes each collective is handed, around any other communicator.

Counted per operation (``calls`` and ``bytes``, keyed by the seam's method name, non-blocking
forms under their blocking name) is the *payload*: the size of the whole vector the collective
works on. That is the unit the ZeRO paper counts in: an all-reduce of Ψ elements moves 2Ψ
(a reduce-scatter and an all-gather of Ψ each), a reduce-scatter or an all-gather Ψ.

* ``allreduce``: the buffer; :meth:`CountingComm.volume` counts it twice.
* ``reduce_scatter``: the send buffer (all segments); ``allgather``: the receive buffer (all slots).
* ``broadcast``, ``reduce``: the buffer; ``gather``, ``scatter``: the per-rank buffer times the size.

How much of that a rank actually puts on the wire depends on the algorithm MPI picks. A
bandwidth-optimal one (the ring) sends ``(R-1)/R`` of the volume from every rank:
:meth:`CountingComm.ring_bytes_sent`. Point-to-point calls are counted as the bytes sent.
"""

from __future__ import annotations

from collections import Counter

from ..base import Communicator, Request
from .wrapper import CommWrapper


def nbytes(buf) -> int:
    return buf.numel() * buf.element_size() if hasattr(buf, "element_size") else buf.nbytes


class CountingComm(CommWrapper):
    """``inner``, adding up calls and payload bytes per operation."""

    def __init__(self, inner: Communicator):
        super().__init__(inner)
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()

    def _count(self, op: str, n: int) -> None:
        self.calls[op] += 1
        self.bytes[op] += n

    def volume(self) -> int:
        """Collective bytes in the paper's units: an all-reduce counts as a reduce-scatter plus an all-gather."""
        return sum(n * (2 if op == "allreduce" else 1) for op, n in self.bytes.items() if op != "send")

    def ring_bytes_sent(self) -> float:
        """Bytes this rank sends if every collective is bandwidth-optimal, (R-1)/R of :meth:`volume`,
        plus what it sent point to point."""
        return self.volume() * (self.size - 1) / self.size + self.bytes["send"]

    # -- point to point -------------------------------------------------------------------
    def send(self, buf, dest, tag=0):
        self._count("send", nbytes(buf))
        return self.inner.send(buf, dest, tag)

    def isend(self, buf, dest, tag=0) -> Request:
        self._count("send", nbytes(buf))
        return self.inner.isend(buf, dest, tag)

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, buf, op="sum"):
        self._count("allreduce", nbytes(buf))
        return self.inner.allreduce(buf, op)

    def iallreduce(self, buf, op="sum") -> Request:
        self._count("allreduce", nbytes(buf))
        return self.inner.iallreduce(buf, op)

    def broadcast(self, buf, root=0):
        self._count("broadcast", nbytes(buf))
        return self.inner.broadcast(buf, root)

    def reduce(self, buf, op="sum", root=0):
        self._count("reduce", nbytes(buf))
        return self.inner.reduce(buf, op, root)

    def gather(self, sendbuf, recvbuf=None, root=0):
        self._count("gather", nbytes(sendbuf) * self.size)
        return self.inner.gather(sendbuf, recvbuf, root)

    def allgather(self, sendbuf, recvbuf):
        self._count("allgather", nbytes(recvbuf))
        return self.inner.allgather(sendbuf, recvbuf)

    def iallgather(self, sendbuf, recvbuf) -> Request:
        self._count("allgather", nbytes(recvbuf))
        return self.inner.iallgather(sendbuf, recvbuf)

    def scatter(self, sendbuf, recvbuf, root=0):
        self._count("scatter", nbytes(recvbuf) * self.size)
        return self.inner.scatter(sendbuf, recvbuf, root)

    def reduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        self._count("reduce_scatter", nbytes(sendbuf))
        return self.inner.reduce_scatter(sendbuf, recvbuf, counts, op)

    def ireduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum") -> Request:
        self._count("reduce_scatter", nbytes(sendbuf))
        return self.inner.ireduce_scatter(sendbuf, recvbuf, counts, op)
