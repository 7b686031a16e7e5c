"""Stall watchdog: a rank waiting in a collective too long names who is missing, and the job ends.

The classic MPI failure is the silent hang: one rank dies, stalls or takes another branch, and
the rest wait in a collective for ever. :class:`Watchdog` wraps any communicator and notes, for
every call, what this rank is doing: the collective it started (a sequence number, the call's
name and its arguments' signature), the call it is blocked in (a blocking collective, or the
``wait()`` of a non-blocking one) and since when, and where the training loop last said it was
(``where("forward", step)``). When a call has waited ``timeout`` seconds (``--stall-timeout``,
default 60, or ``MPI_SGD_STALL_TIMEOUT``), the rank asks every other rank for the same notes and
prints which ranks have not started that call, where each was last seen and every rank's Python
stack (written by :mod:`faulthandler`), then aborts the job with status 1 (``abort_after``:
seconds of waiting before the abort, default the timeout; 0 reports only). The message is built
by :mod:`mpi_sgd.comm.wrappers.stallreport`. A part of a split communicator gets a watchdog of its
own with the same settings; its reports name each rank by its rank in the part and in the job.

**How a rank blocked in MPI learns about the others**: from a thread of its own with a side
channel, a duplicated communicator polled with non-blocking calls, which needs
``MPI_THREAD_MULTIPLE`` (see :mod:`mpi_sgd.comm.wrappers.monitor`, which also says why not one-sided
heartbeats).

**Collective mismatch, always on and cheap.** Every collective's name and signature (shape,
dtype, op, root) go into a running CRC on each rank; every ``CHECK_EVERY`` calls it is kept, and
each thread sends its newest one to rank 0's thread, which compares it with its own at the same
call number. A difference (ranks that passed different lengths to ``iallreduce``, say, which MPI
does not notice) makes rank 0 fetch that rank's recent calls, print the first call that differed
on each rank, and abort; at exit every rank sends its final CRC, so a job too short for the
periodic check still fails. Ranks that disagree and then deadlock are named by the stall report,
which compares the call both made at the stalled sequence number. Debug mode
(:class:`~mpi_sgd.comm.wrappers.checked.CheckedComm`) still checks every call before it is made.

Only small control messages cross the side channel, as JSON (never pickle); nothing listens on
a socket.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import tempfile
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable

from ..base import ANY_SOURCE, ANY_TAG, Request
from .monitor import Monitor
from .stallreport import call_label
from .wrapper import CommWrapper

CHECK_EVERY = 16  # collectives per kept CRC


_SIGS: dict = {}  # (shape, dtype) -> its text: formatting it anew costs more than the rest of a call's notes


def _sig(buf) -> str:
    if buf is None:
        return "none"
    key = (buf.shape, buf.dtype)
    text = _SIGS.get(key)
    if text is None:
        text = _SIGS[key] = f"{tuple(buf.shape)} {str(buf.dtype).replace('torch.', '')}"
    return text


def without_watchdog(comm):
    """The communicator a :class:`Watchdog` wraps (``comm`` itself if it is none): what a benchmark
    times when the watchdog's own cost is not the question."""
    return comm.inner if isinstance(comm, Watchdog) else comm


class Watchdog(CommWrapper):
    """``inner`` with every call noted, and a thread that reports (and ends) a stall."""

    def __init__(
        self,
        inner,
        timeout: float = 60.0,
        abort_after: float | None = None,
        poll: float | None = None,
        report: Callable[[str], None] | None = None,
        world_ranks: list[int] | None = None,
    ):
        super().__init__(inner)
        self.report = report or _to_stderr  # where the messages go (a test keeps them)
        # Each rank's rank in the job, which messages add to a sub-communicator's own rank numbers.
        self.world_ranks = list(range(self.size)) if world_ranks is None else list(world_ranks)
        self.timeout = timeout
        self.abort_after = timeout if abort_after is None else (max(abort_after, timeout) if abort_after else 0.0)
        self.poll = poll if poll is not None else min(0.5, timeout / 10)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.step, self.index, self.phase, self.phase_t = None, 0, "start-up", time.monotonic()
        self.seq, self.crc, self.blocked = 0, 0, None
        self.patience = 0.0  # seconds a wait may take while the ranks agree one is long (a save): see patient()
        self.calls: deque = deque(maxlen=4 * 1024)  # (seq, name, step, index, call): what a mismatch report shows
        self.checks: deque = deque(maxlen=256)  # (seq, crc after it)
        self.monitor = Monitor.start(self) if self.size > 1 else None

    def _rewrap(self, inner):
        """A watchdog of its own around a part: the same timeout, abort and poll settings, its own
        thread and side channel (a duplicate of the part), and the job's rank numbers for its reports."""
        return self._rebuild(inner, world_ranks=inner.allgather_obj(self.world_ranks[self.rank]))

    # -- what this rank is doing (main thread) ------------------------------------------------
    def where(self, phase: str, step: int | None = None) -> None:
        if step is not None and step != self.step:
            self.step, self.index = step, 0
        self.phase, self.phase_t = phase, time.monotonic()
        self.inner.where(phase, step)

    def patient(self, seconds: float):
        """While in this context, a call may wait ``seconds`` (if longer than the timeout) before it
        is reported or aborted: every rank enters it at the same point of a collective section whose
        duration has its own deadline, a checkpoint save (:mod:`mpi_sgd.checkpoint.deadline`)."""
        return _Patience(self, seconds)

    # Per call only raw facts are kept, (seq, name, step, index in step, call text); labels are
    # formatted when someone asks (status, history), which is rare.
    def _start(self, name: str, sig: str) -> tuple:
        self.seq += 1
        call = f"{name}({sig})"
        entry = (self.seq, name, self.step, self.index, call)
        self.calls.append(entry)
        self.index += 1
        self.crc = zlib.crc32(call.encode(), self.crc)
        if self.seq % CHECK_EVERY == 0:
            self.checks.append((self.seq, self.crc))
        return entry

    def _blocking(self, name: str, sig: str, call, *args):
        self.blocked = (self._start(name, sig), "", time.monotonic())
        try:
            return call(*args)
        finally:
            self.blocked = None

    def _nonblocking(self, name: str, sig: str, call, *args) -> Request:
        entry = self._start(name, sig)
        req = call(*args)

        def wait(r):
            self.blocked = (entry, "wait() of ", time.monotonic())
            try:
                r.wait()
            finally:
                self.blocked = None

        return Request(req, wait, lambda r: r.test())

    def _p2p(self, what: str, call, *args):
        self.blocked = (None, what, time.monotonic())
        try:
            return call(*args)
        finally:
            self.blocked = None

    # -- the seam -------------------------------------------------------------------------------
    def send(self, buf, dest, tag=0):
        return self._p2p(f"send to rank {dest} (tag {tag})", self.inner.send, buf, dest, tag)

    def recv(self, buf, source, tag=0):
        who = "any rank" if source == ANY_SOURCE else f"rank {source}"
        return self._p2p(f"recv from {who} (tag {tag})", self.inner.recv, buf, source, tag)

    def allreduce(self, buf, op="sum"):
        return self._blocking("allreduce", f"{_sig(buf)} {op}", self.inner.allreduce, buf, op)

    def iallreduce(self, buf, op="sum"):
        return self._nonblocking("iallreduce", f"{_sig(buf)} {op}", self.inner.iallreduce, buf, op)

    def broadcast(self, buf, root=0):
        return self._blocking("broadcast", f"{_sig(buf)} root {root}", self.inner.broadcast, buf, root)

    def reduce(self, buf, op="sum", root=0):
        return self._blocking("reduce", f"{_sig(buf)} {op} root {root}", self.inner.reduce, buf, op, root)

    def gather(self, sendbuf, recvbuf=None, root=0):
        return self._blocking("gather", f"{_sig(sendbuf)} root {root}", self.inner.gather, sendbuf, recvbuf, root)

    def allgather(self, sendbuf, recvbuf):
        return self._blocking("allgather", _sig(sendbuf), self.inner.allgather, sendbuf, recvbuf)

    def scatter(self, sendbuf, recvbuf, root=0):
        return self._blocking("scatter", f"{_sig(recvbuf)} root {root}", self.inner.scatter, sendbuf, recvbuf, root)

    def reduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        sig = f"{_sig(sendbuf)} {op} counts {None if counts is None else tuple(counts)}"
        return self._blocking("reduce_scatter", sig, self.inner.reduce_scatter, sendbuf, recvbuf, counts, op)

    def ireduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        sig = f"{_sig(sendbuf)} {op} counts {None if counts is None else tuple(counts)}"
        return self._nonblocking("ireduce_scatter", sig, self.inner.ireduce_scatter, sendbuf, recvbuf, counts, op)

    def iallgather(self, sendbuf, recvbuf):
        return self._nonblocking("iallgather", _sig(sendbuf), self.inner.iallgather, sendbuf, recvbuf)

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG, dtype=None):
        who = "any rank" if source == ANY_SOURCE else f"rank {source}"
        return self._p2p(f"probe for a message from {who}", self.inner.probe, source, tag, dtype)

    def barrier(self):
        return self._blocking("barrier", "", self.inner.barrier)

    def ibarrier(self):
        return self._nonblocking("ibarrier", "", self.inner.ibarrier)

    def bcast_obj(self, obj, root=0):
        return self._blocking("bcast_obj", f"root {root}", self.inner.bcast_obj, obj, root)

    def allgather_obj(self, obj):
        return self._blocking("allgather_obj", "", self.inner.allgather_obj, obj)

    def gather_obj(self, obj, root=0):
        return self._blocking("gather_obj", f"root {root}", self.inner.gather_obj, obj, root)

    # -- this rank, described (any thread) ---------------------------------------------------------
    def history(self, calls: int | None = None) -> list[list]:
        """The last ``calls`` collectives (all kept if None) as ``[seq, label, call]``."""
        kept = list(self.calls)  # one C-level copy: safe while the main thread appends
        return [
            [seq, call_label(name, step, index, seq), call] for seq, name, step, index, call in kept[-(calls or 0) :]
        ]

    def status(self, stack: bool = True, calls: int = 16) -> dict:
        now, blocked = time.monotonic(), self.blocked
        if blocked is not None:
            entry, what, since = blocked
            if entry is None:  # point to point: what says it all
                blocked = [None, what, now - since]
            else:
                seq, name, step, index, _ = entry
                blocked = [seq, what + call_label(name, step, index, seq), now - since]
        return {
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "step": self.step,
            "phase": self.phase,
            "phase_age": now - self.phase_t,
            "seq": self.seq,
            "left": False,
            "blocked": blocked,
            "calls": self.history(calls),
            "stack": _stacks(drop_current=threading.current_thread() is not threading.main_thread()) if stack else "",
        }

    def close(self) -> None:
        """Stop the watchdog's thread and free its communicator (collective). Calls still pass
        through, unless this watchdog made the communicator it wraps (:meth:`CommWrapper.close`)."""
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
        super().close()


class _Patience:
    def __init__(self, wd: Watchdog, seconds: float):
        self.wd, self.seconds, self.before = wd, seconds, wd.patience

    def __enter__(self):
        self.wd.patience = max(self.before, self.seconds)

    def __exit__(self, *exc):
        self.wd.patience = self.before


def _to_stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _stacks(drop_current: bool) -> str:
    """Every thread's Python stack as :func:`faulthandler.dump_traceback` writes it; ``drop_current``
    leaves out the calling thread's (the watchdog's own, which says nothing about the job)."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        blocks = f.read().split("\n\n")
    return "\n\n".join(b for b in blocks if not (drop_current and b.startswith("Current thread")))
