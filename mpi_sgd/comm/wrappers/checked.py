"""Debug mode: every collective first checks that all ranks are making the same call.

MPI trusts its callers. Ranks that enter one all-reduce with different lengths get a truncation
error at best and a hang or a silently wrong sum at worst; different roots or ops are never
noticed. :class:`CheckedComm` wraps any communicator and, before each collective, gathers what
every rank passed (shape, dtype, op, root) with an ``allgather_obj``, a collective every rank
makes, so a disagreement cannot hang it either. If the ranks differ, every rank raises
:class:`CollectiveMismatchError` listing each rank's arguments, and nothing is communicated.

It costs a small collective per call, so it is off unless asked for:
``comm.init(..., debug=True)`` or ``MPI_SGD_DEBUG=1``. Point-to-point calls are not checked:
only the two ranks of a message know of it.
"""

from __future__ import annotations

from ..base import CollectiveMismatchError
from ..buffers import signature
from .wrapper import CommWrapper


class CheckedComm(CommWrapper):
    """``inner`` with every collective's arguments compared across ranks before the call."""

    def _agree(self, name: str, mine: tuple) -> None:
        everyone = self.inner.allgather_obj(mine)
        if any(sig != everyone[0] for sig in everyone):
            lines = "\n".join(f"  rank {r}: {sig}" for r, sig in enumerate(everyone))
            raise CollectiveMismatchError(
                f"ranks called {name} with different arguments (shape/dtype, op, root):\n{lines}"
            )

    def allreduce(self, buf, op="sum"):
        self._agree("allreduce", (signature(buf), op))
        return self.inner.allreduce(buf, op)

    def iallreduce(self, buf, op="sum"):
        self._agree("iallreduce", (signature(buf), op))
        return self.inner.iallreduce(buf, op)

    def broadcast(self, buf, root=0):
        self._agree("broadcast", (signature(buf), root))
        return self.inner.broadcast(buf, root)

    def reduce(self, buf, op="sum", root=0):
        self._agree("reduce", (signature(buf), op, root))
        return self.inner.reduce(buf, op, root)

    def gather(self, sendbuf, recvbuf=None, root=0):
        # recvbuf exists on the root only, so only what is sent must agree
        self._agree("gather", (signature(sendbuf), root))
        return self.inner.gather(sendbuf, recvbuf, root)

    def allgather(self, sendbuf, recvbuf):
        self._agree("allgather", (signature(sendbuf), signature(recvbuf)))
        return self.inner.allgather(sendbuf, recvbuf)

    def scatter(self, sendbuf, recvbuf, root=0):
        self._agree("scatter", (signature(recvbuf), root))
        return self.inner.scatter(sendbuf, recvbuf, root)

    def reduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        self._agree("reduce_scatter", (signature(sendbuf), None if counts is None else tuple(counts), op))
        return self.inner.reduce_scatter(sendbuf, recvbuf, counts, op)

    def ireduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        self._agree("ireduce_scatter", (signature(sendbuf), None if counts is None else tuple(counts), op))
        return self.inner.ireduce_scatter(sendbuf, recvbuf, counts, op)

    def iallgather(self, sendbuf, recvbuf):
        self._agree("iallgather", (signature(sendbuf), signature(recvbuf)))
        return self.inner.iallgather(sendbuf, recvbuf)
