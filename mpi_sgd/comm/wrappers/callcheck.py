"""Every reduction checked before its result can be read: ranks that disagree on length, dtype or op
get one error naming each rank's call, never a wrong sum.

MPI trusts its callers. Two ranks that enter one ``Allreduce`` with 5 and 6 floats get, depending
on the algorithm MPI picks, a "message truncated" error on one rank, a wrong sum with no error at
all, or a hang; ``Iallreduce`` never notices. The watchdog's running CRC finds such a call after
the fact (:mod:`.watchdog`), and debug mode (:mod:`.checked`) finds it before the call, at the
price of a blocking exchange of pickled objects per call.

Two ways, by where the ranks are. **All on one host** (every single-node job), a blocking call
is agreed in shared memory, with no MPI call at all. Each rank has a page of its own in a window
the ranks share (:class:`~mpi_sgd.comm.shm.sync.NodeSync`) and stores into it one 8-byte word: its
count of checked calls in the high half, ``h`` in the low half (``h`` a 31-bit code of the call's
name, element count, dtype and op). It waits until every other rank's word carries the same count,
then compares the words. One aligned 8-byte store is atomic, so no fence is needed. A fast rank
may already have stored its next call's word when a slow one reads (MPI's reduction in between
cannot finish before every rank has entered it, but a caller that catches an error raised before
MPI was reached goes on without it); it can only have got there by finding the slow rank's word
equal to its own, so a word one call ahead counts as agreement, and no rank gets two calls ahead.
The wait is the shared all-reduce's own: bounded, naming a dead or stalled rank, entering MPI
every few polls. **Across hosts**, and for every non-blocking call (several can be in flight, so
one word per rank would not do), it is one tiny all-reduce on a duplicate of the communicator:
each rank contributes ``(h, -h)`` under ``MAX``, so every rank learns ``max h`` and ``min h`` at
once. Either way, if the ranks differ they exchange their calls (on the duplicate, where the
broken call cannot get in the way) and every rank raises
:class:`~mpi_sgd.comm.errors.CollectiveMismatchError` naming each rank's length, dtype and op, so
MPI never sees the mismatched call and never gets to say "Message truncated". A blocking call
waits for the check before it starts: with mismatched lengths it might never return (MPICH's
shared-memory algorithms can wait for bytes that never come). A non-blocking call starts both,
and ``wait()`` settles the check before the call, so the check's latency hides behind the
caller's overlap. Ranks that make a different *number* of calls, or one a blocking and another a
non-blocking call, are a stall, which the watchdog names.

It covers the reductions, whose results a caller reads (``allreduce``, ``iallreduce``,
``reduce_scatter``, ``ireduce_scatter``, whose cut into shares is part of the call), on the mpi4py
backend; an all-reduce of a node-shared buffer is left to the shared path's own check; torch's
backends check lengths themselves (gloo aborts with ``op.preamble.length <= op.nbytes``). Its cost is measured by
``mpi-sgd bench allreduce --impls seam,seam-checked``; ``MPI_SGD_CALL_CHECK=0`` turns it off.
A 31-bit code can collide: two different calls that share a code (odds about 1 in 2**31) pass.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from ..base import Request
from ..errors import CollectiveMismatchError
from .wrapper import CommWrapper

WORD = 0  # where in its page of the shared window a rank stores its call's word


class CallCheck(CommWrapper):
    """``inner`` (an MPI backend: it has ``comm``) with every reduction's arguments compared across
    ranks before its result is handed back."""

    def __init__(self, inner):
        super().__init__(inner)
        self.calls = 0
        self._codes: dict = {}
        self.side = self._skip = self._here = None  # made at the first reduction, which every rank makes alike
        self._seq = 0

    def _ready(self) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self.side = self.inner.comm.Dup()  # the checks' own order of calls, apart from the job's
        self._skip = getattr(self.inner, "checks_own_calls", None)  # the node-shared all-reduce checks itself
        if self.inner.size > 1 and getattr(self.inner, "one_node", False):
            from ..shm.sync import QUICK_POLLS, NodeSync

            ranks = list(range(self.inner.size))
            self._here = NodeSync(self.side, ranks, host_ranks=self.inner.local_size, name="reduction argument check")
            self._others = [q for q in ranks if q != self.inner.rank]
            self._mine, self._pages = self._here.flags[self.inner.rank], [self._here.flags[q] for q in self._others]
            self._polls = QUICK_POLLS if self._here.spin_seconds else 0

    def close(self) -> None:
        """Free the checks' duplicate and shared window (collective), then what it wraps if it made it."""
        if self._here is not None:
            self._mine = self._pages = None  # views of the window: gone with it
            self._here.close()
            self._here = None
        if self.side is not None:
            self.side.Free()
            self.side = None
        super().close()

    def _word(self, name: str, buf, op: str, counts=None) -> tuple:
        """The call's description, its code ``h`` and the template ``(h, -h)``, made once per kind
        of call: a dictionary lookup is what the common case costs. ``counts``: a reduce-scatter's
        share per rank, part of the call (ranks that cut the buffer differently disagree too)."""
        # (the seam takes numpy arrays too; a tensor subclass, nn.Parameter, counts as a tensor)
        count = buf.numel() if isinstance(buf, torch.Tensor) else buf.size
        counts = tuple(counts) if counts is not None else None
        key = (name, count, buf.dtype, op, counts)
        found = self._codes.get(key)
        if found is None:
            text = f"{name} of {count} {str(buf.dtype).replace('torch.', '')}, op {op}"
            text += f", counts {list(counts)}" if counts is not None else ""
            code = zlib.crc32(text.encode()) & 0x7FFFFFFF
            found = self._codes[key] = (text, np.array([code, -code], dtype=np.int64), code)
        return found

    def _agree_here(self, name: str, buf, op: str, counts=None) -> None:
        """A blocking call agreed in shared memory (see the module docstring); raises on disagreement."""
        self.calls += 1
        text, _, code = self._word(name, buf, op, counts)
        seq = self._seq = self._seq % 0x7FFFFFFF + 1  # never 0, which a fresh page holds; below 2**31
        ahead, word = seq % 0x7FFFFFFF + 1, (seq << 32) | code
        self._mine[WORD] = word
        for theirs in self._pages:
            if theirs[WORD] == word:  # the common case: the peer got here first, with the same call
                continue
            # A peer whose word already carries the next call got past this one, which it can only do
            # by seeing this rank's word match its own (a caller that goes on without the reduction,
            # after it raised before reaching MPI, say): it has agreed. Peers are never further apart.
            if theirs[WORD] >> 32 not in (seq, ahead):
                for _ in range(self._polls):  # a peer a few microseconds behind: bare polls see it soonest
                    if theirs[WORD] >> 32 in (seq, ahead):
                        break
                else:
                    self._wait_long(seq, ahead)
            found = theirs[WORD]
            if found >> 32 == seq and found != word:
                self._disagree(text)

    def _wait_long(self, seq: int, ahead: int) -> None:
        """The shared all-reduce's bounded wait, until every peer's word carries call ``seq`` or the next."""
        pages = dict(zip(self._others, self._pages, strict=True))
        missing = lambda: [q for q, p in pages.items() if p[WORD] >> 32 not in (seq, ahead)]  # noqa: E731
        self._here.spin(missing, f"to make reduction call #{self.calls}")

    def _start(self, name: str, buf, op: str, blocking: bool = False, counts=None):
        self.calls += 1
        text, template, _ = self._word(name, buf, op, counts)
        word = template.copy()
        MPI = self._MPI
        # Blocking, it is MPI's fastest small all-reduce; non-blocking, it can overlap the call.
        if blocking:
            self.side.Allreduce(MPI.IN_PLACE, [word, MPI.INT64_T], MPI.MAX)
            req = None
        else:
            req = self.side.Iallreduce(MPI.IN_PLACE, [word, MPI.INT64_T], MPI.MAX)
        return req, word, text

    def _finish(self, check) -> None:
        """Wait for the check; on disagreement every rank raises the same message."""
        req, word, text = check
        if req is not None:
            req.Wait()
        high, low = word.tolist()
        if high != -low:
            self._disagree(text)

    def _disagree(self, text: str) -> None:
        """Every rank, having seen the ranks differ: exchange the calls and raise the same message."""
        everyone = self.side.allgather(f"{text} (call #{self.calls})")
        differ = [str(r) for r, call in enumerate(everyone) if call != everyone[0]]
        lines = "\n".join(f"  rank {r}: {call}" for r, call in enumerate(everyone))
        raise CollectiveMismatchError(
            f"rank{'s' if len(differ) > 1 else ''} {', '.join(differ)} made a different reduction from rank 0's "
            f"(length, dtype or op); the call was not completed:\n{lines}"
        )

    def _unchecked(self, buf) -> bool:
        """Whether ``buf``'s call needs no check of ours (made ready at the first reduction)."""
        if self.side is None:
            self._ready()
        return self._skip is not None and self._skip(buf)

    def _blocking(self, name, buf, op, call, *args, counts=None):
        if self.side is None:
            self._ready()
        # _unchecked(), inline: every call pays for it (a reduce-scatter never takes the shared path)
        if counts is None and name == "allreduce" and self._skip is not None and self._skip(buf):
            return call(*args)
        # The check first: a blocking reduction with mismatched lengths may not return at all
        # (MPICH's shared-memory algorithms wait for bytes that never come), so it is not started.
        if self._here is not None:
            self._agree_here(name, buf, op, counts)
        else:
            self._finish(self._start(name, buf, op, blocking=True, counts=counts))
        return call(*args)

    def _nonblocking(self, name, buf, op, call, *args, counts=None) -> Request:
        if name == "iallreduce" and self._unchecked(buf):
            return call(*args)
        if self.side is None:
            self._ready()
        check = self._start(name, buf, op, counts=counts)
        inner = call(*args)  # both in flight; wait() settles the check first, for the same reason

        def wait(r):
            self._finish(check)
            r.wait()

        def test(r):
            if not check[0].Test():
                return False
            self._finish(check)
            return r.test()

        return Request(inner, wait, test)

    def allreduce(self, buf, op="sum"):
        return self._blocking("allreduce", buf, op, self.inner.allreduce, buf, op)

    def iallreduce(self, buf, op="sum") -> Request:
        return self._nonblocking("iallreduce", buf, op, self.inner.iallreduce, buf, op)

    def reduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        call, share = self.inner.reduce_scatter, _counts(sendbuf, recvbuf, counts)
        return self._blocking("reduce_scatter", sendbuf, op, call, sendbuf, recvbuf, counts, op, counts=share)

    def ireduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum") -> Request:
        call, share = self.inner.ireduce_scatter, _counts(sendbuf, recvbuf, counts)
        return self._nonblocking("ireduce_scatter", sendbuf, op, call, sendbuf, recvbuf, counts, op, counts=share)


def _counts(sendbuf, recvbuf, counts) -> tuple:
    """A reduce-scatter's cut, as part of the call: the counts given, else this rank's share (the
    receive buffer's length: equal shares, which ranks expecting others would not have)."""
    if counts is not None:
        return tuple(int(c) for c in counts)
    return (recvbuf.numel() if isinstance(recvbuf, torch.Tensor) else recvbuf.size,)
