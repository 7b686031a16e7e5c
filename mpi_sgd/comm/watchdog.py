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
by :mod:`mpi_sgd.comm.stallreport`.

**How a rank blocked in MPI learns about the others.** The main thread is inside MPI (or gloo)
and cannot ask anything, so each rank runs one daemon thread that owns a side channel: a
duplicate of the job's MPI communicator (``Dup``: its own context, so its messages can never
match the training's), used with non-blocking point-to-point calls only (``Iprobe``, ``Isend``,
``Recv`` of a probed message) and polled every ``poll`` seconds. That needs MPI to accept calls
from two threads at once, ``MPI_THREAD_MULTIPLE``: mpi4py asks for it at initialisation by
default (``mpi4py.rc.thread_level = "multiple"``), MPICH and Open MPI provide it, and the
watchdog checks ``MPI.Query_thread()`` and stays off (with a warning) where it is not provided.
MPI one-sided heartbeats (``MPI_Put`` into a window) were the alternative; they also need a
second thread to read the window while the first is blocked, and they give a constant stream of
RMA traffic in place of messages only when something is wrong. With the torch backends the side
channel is the mpi4py communicator the torch group was made over; gloo and nccl release the GIL
while they wait, so the thread runs. A stalled rank's own thread keeps answering (a Python
``sleep`` or a loop releases the GIL); a killed one does not answer and is named as such.

**Collective mismatch, always on and cheap.** Every collective's name and signature (shape,
dtype, op, root) go into a running CRC on each rank; every ``CHECK_EVERY`` calls it is kept, and
each thread sends its newest one to rank 0's thread, which compares it with its own at the same
call number. A difference (ranks that passed different lengths to ``iallreduce``, say, which MPI
does not notice) makes rank 0 fetch that rank's recent calls, print the first call that differed
on each rank, and abort. Ranks that disagree and then deadlock are named by the stall report,
which compares the call both made at the stalled sequence number. Debug mode
(:class:`~mpi_sgd.comm.checked.CheckedComm`) still checks every call before it is made.

Only small control messages cross the side channel, as JSON (never pickle), and only when
something is asked for; nothing listens on a socket.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import socket
import sys
import tempfile
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable

from .base import Request
from .stallreport import call_label, mismatch_report, stall_report
from .wrapper import CommWrapper

REQ, STATUS, LEFT, CHECK, HIST_REQ, HIST = range(1, 7)  # side-channel tags
CHECK_EVERY = 16  # collectives per kept CRC
ANSWER_WAIT = 2.0  # seconds to wait for the others' answers


def _sig(buf) -> str:
    return "none" if buf is None else f"{tuple(buf.shape)} {str(buf.dtype).replace('torch.', '')}"


def _side_comm(comm):
    """The mpi4py communicator under ``comm`` (an MPIComm's, or the one a torch group was made over)."""
    from mpi4py import MPI

    for attr in ("comm", "mpi"):
        c = getattr(comm, attr, None)
        if isinstance(c, MPI.Comm):
            return c
        if c is not None and isinstance(getattr(c, "comm", None), MPI.Comm):
            return c.comm
    return None


class Watchdog(CommWrapper):
    """``inner`` with every call noted, and a thread that reports (and ends) a stall."""

    def __init__(self, inner, timeout: float = 60.0, abort_after: float | None = None, poll: float | None = None,
                 report: Callable[[str], None] | None = None):  # fmt: skip
        super().__init__(inner)
        self.report = report or _to_stderr  # where the messages go (a test keeps them)
        self.timeout = timeout
        self.abort_after = timeout if abort_after is None else (max(abort_after, timeout) if abort_after else 0.0)
        self.poll = poll if poll is not None else min(0.5, timeout / 10)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.step, self.index, self.phase, self.phase_t = None, 0, "start-up", time.monotonic()
        self.seq, self.crc, self.blocked = 0, 0, None
        self.calls: deque = deque(maxlen=4 * 1024)  # (seq, label, signature): what the mismatch check shows
        self.checks: deque = deque(maxlen=256)  # (seq, crc after it)
        self._replies: dict[int, dict] = {}
        self._left: dict[int, dict] = {}
        self._theirs: dict[int, tuple] = {}  # rank 0: the newest (seq, crc) of each rank
        self._sends: list = []
        self._sent_check = None
        self._stop = threading.Event()
        self._side, self._thread = None, None
        if self.size > 1:
            self._start_thread()

    # -- what this rank is doing (main thread) ------------------------------------------------
    def where(self, phase: str, step: int | None = None) -> None:
        if step is not None and step != self.step:
            self.step, self.index = step, 0
        self.phase, self.phase_t = phase, time.monotonic()
        self.inner.where(phase, step)

    def _start(self, name: str, sig: str) -> int:
        self.seq += 1
        seq = self.seq
        call = f"{name}({sig})"
        self.calls.append((seq, call_label(name, self.step, self.index, seq), call))
        self.index += 1
        self.crc = zlib.crc32(call.encode(), self.crc)
        if seq % CHECK_EVERY == 0:
            self.checks.append((seq, self.crc))
        return seq

    def _blocking(self, name: str, sig: str, call, *args):
        seq = self._start(name, sig)
        self.blocked = (seq, self.calls[-1][1], time.monotonic())
        try:
            return call(*args)
        finally:
            self.blocked = None

    def _nonblocking(self, name: str, sig: str, call, *args) -> Request:
        seq = self._start(name, sig)
        label, req = self.calls[-1][1], call(*args)

        def wait(r):
            self.blocked = (seq, f"wait() of {label}", time.monotonic())
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
        return self._p2p(f"recv from rank {source} (tag {tag})", self.inner.recv, buf, source, tag)

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

    def barrier(self):
        return self._blocking("barrier", "", self.inner.barrier)

    def bcast_obj(self, obj, root=0):
        return self._blocking("bcast_obj", f"root {root}", self.inner.bcast_obj, obj, root)

    def allgather_obj(self, obj):
        return self._blocking("allgather_obj", "", self.inner.allgather_obj, obj)

    def gather_obj(self, obj, root=0):
        return self._blocking("gather_obj", f"root {root}", self.inner.gather_obj, obj, root)

    # -- this rank, described (any thread) ---------------------------------------------------------
    def status(self, stack: bool = True, calls: int = 16) -> dict:
        now, blocked = time.monotonic(), self.blocked
        return {
            "rank": self.rank, "host": self.host, "pid": self.pid, "step": self.step, "phase": self.phase,
            "phase_age": now - self.phase_t, "seq": self.seq, "left": False,
            "blocked": None if blocked is None else [blocked[0], blocked[1], now - blocked[2]],
            "calls": [list(c) for c in list(self.calls)[-calls:]],
            "stack": _stacks(drop_current=threading.current_thread() is self._thread) if stack else "",
        }  # fmt: skip

    # -- the side channel (watchdog thread) --------------------------------------------------------
    def _start_thread(self) -> None:
        from mpi4py import MPI

        side = _side_comm(self.inner)
        if side is None:
            return
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            if self.rank == 0:
                sys.stderr.write("mpi_sgd watchdog: MPI was not started with MPI_THREAD_MULTIPLE; stall checks off\n")
            return
        self._side = side.Dup()  # collective: every rank builds its watchdog at the same point
        self._thread = threading.Thread(target=self._run, name="mpi_sgd-watchdog", daemon=True)
        self._thread.start()
        atexit.register(self._leave)

    def _send(self, dest: int, tag: int, payload) -> None:
        from mpi4py import MPI

        data = json.dumps(payload).encode()
        self._sends.append((self._side.Isend([data, MPI.BYTE], dest, tag), data))

    def _serve(self) -> None:
        """Answer what the other ranks' threads sent; drop finished sends."""
        from mpi4py import MPI

        self._sends = [(r, d) for r, d in self._sends if not r.Test()]
        status = MPI.Status()
        while self._side.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            src, tag = status.Get_source(), status.Get_tag()
            data = bytearray(status.Get_count(MPI.BYTE))
            self._side.Recv([data, MPI.BYTE], src, tag)
            msg = json.loads(data)
            if tag == REQ:
                self._send(src, STATUS, self.status())
            elif tag == STATUS:
                self._replies[src] = msg
            elif tag == LEFT:
                self._left[src] = msg
            elif tag == CHECK:
                self._theirs[src] = tuple(msg)
            elif tag == HIST_REQ:
                self._send(src, HIST, {"checks": list(self.checks), "calls": list(self.calls)})
            elif tag == HIST:
                self._replies[src] = msg

    def _ask(self, ranks, tag: int = REQ, payload=None) -> dict[int, dict | None]:
        """Send ``tag`` to ``ranks`` and collect their answers for up to ANSWER_WAIT seconds."""
        for r in ranks:
            self._replies.pop(r, None)
            self._send(r, tag, payload)
        deadline = time.monotonic() + ANSWER_WAIT
        while time.monotonic() < deadline and not all(r in self._replies for r in ranks):
            time.sleep(0.01)
            self._serve()
        return {r: self._replies.pop(r, None) for r in ranks}

    def _run(self) -> None:
        reported = None
        try:
            while not self._stop.wait(self.poll):
                self._serve()
                self._check_calls()
                blocked = self.blocked
                if blocked is None:
                    continue
                waited = time.monotonic() - blocked[2]
                if waited >= self.timeout and reported != blocked:
                    reported = blocked
                    self._report_stall()
                if self.abort_after and waited >= self.abort_after and reported == blocked:
                    self._abort()
        except Exception as e:  # the watchdog must never be what breaks a job
            sys.stderr.write(f"mpi_sgd watchdog on rank {self.rank} stopped: {e!r}\n")

    def _report_stall(self) -> None:
        me = self.status()
        if me["blocked"] is None:
            return  # the call returned meanwhile
        others = [r for r in range(self.size) if r != self.rank and r not in self._left]
        answers = {**self._left, **self._ask(others)}
        # One report per stall: the lowest rank that has waited as long reports; the rest defer to it.
        for r, s in answers.items():
            if r < self.rank and s and s["blocked"] and s["blocked"][2] >= self.timeout - 2 * self.poll:
                return
        self.report(stall_report(me, answers, self.timeout))

    def _check_calls(self) -> None:
        """The always-on mismatch check: every rank's newest kept CRC against rank 0's."""
        if self.rank != 0:
            if self.checks and self.checks[-1][0] != self._sent_check:
                self._sent_check = self.checks[-1][0]
                self._send(0, CHECK, list(self.checks[-1]))
            return
        mine = dict(self.checks)
        for r, (seq, crc) in list(self._theirs.items()):
            if seq in mine or not self.checks or seq < self.checks[0][0]:
                del self._theirs[r]  # compared now, or older than what rank 0 keeps
                if mine.get(seq, crc) != crc:
                    self._report_mismatch(r, self._ask([r], HIST_REQ)[r])

    def _report_mismatch(self, rank: int, theirs: dict | None) -> None:
        """Print the first call that differed between rank 0 and ``rank`` (from its history), and abort."""
        text = f"mpi_sgd watchdog: rank {rank}'s collective calls differ from rank 0's"
        if theirs:
            mine = {c[0]: c for c in self.calls}
            differ = sorted(c[0] for c in theirs["calls"] if c[0] in mine and mine[c[0]][2] != c[2])
            if differ:
                first = next(c for c in theirs["calls"] if c[0] == differ[0])
                text = mismatch_report(differ[0], {0: list(mine[differ[0]]), rank: first})
            else:
                text += f": rank 0 made {self.seq} collective calls, rank {rank} {theirs['seq']}"
        self.report(text)
        self._abort()

    def _abort(self) -> None:
        time.sleep(0.5)  # let the launcher forward the report before the abort tears its pipes down
        self.inner.abort(1)

    def close(self) -> None:
        """Stop the watchdog thread and free its communicator (collective); calls still pass through."""
        if self._thread is not None:
            atexit.unregister(self._leave)
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._side.Free()

    def _leave(self) -> None:
        """At exit: stop the thread and tell the others, so a rank that returned early is named.

        Rank 0 also waits (ANSWER_WAIT at most) for every rank's last word and compares their running
        CRCs with its own: a mismatch the periodic check had no time to see still fails the job.
        """
        self._stop.set()
        self._thread.join(timeout=2 * self.poll + 1)
        try:
            me = {**self.status(stack=False), "left": True, "crc": self.crc}
            for r in range(self.size):
                if r != self.rank:
                    self._send(r, LEFT, {**me, "calls": list(self.calls)} if r == 0 else me)
            deadline = time.monotonic() + ANSWER_WAIT
            while self.rank == 0 and len(self._left) < self.size - 1 and time.monotonic() < deadline:
                time.sleep(0.005)
                self._serve()
            for r, s in sorted(self._left.items()):
                if self.rank == 0 and (s["seq"], s["crc"]) != (self.seq, self.crc):
                    self._report_mismatch(r, s)
            while self._sends and time.monotonic() < deadline:
                self._sends = [(r, d) for r, d in self._sends if not r.Test()]
        except Exception:
            pass  # MPI may already be going down; leaving quietly is all that is left


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
