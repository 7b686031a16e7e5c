"""The watchdog's thread: how a rank blocked in MPI learns where the other ranks are.

A rank whose main thread waits inside MPI (or gloo) cannot ask anything, so each rank of a job
with a :class:`~mpi_sgd.comm.wrappers.watchdog.Watchdog` runs one daemon thread, a :class:`Monitor`, with
a side channel of its own: a duplicate of the job's MPI communicator (``Dup``: its own context,
so its messages can never match the training's), used with non-blocking point-to-point calls
only (``Iprobe``, ``Isend``, ``Recv`` of a probed message) and polled every ``poll`` seconds.
That needs MPI to accept calls from two threads at once, ``MPI_THREAD_MULTIPLE``: mpi4py asks for
it at initialisation by default (``mpi4py.rc.thread_level = "multiple"``), MPICH and Open MPI
provide it, and the monitor checks ``MPI.Query_thread()`` and stays off, saying so, where it is
not provided. MPI one-sided heartbeats (each rank ``MPI_Put``-ing its state into a window) were
the alternative; reading the window while the main thread is blocked needs the same second
thread, and they would send a constant stream of updates where messages here flow only when a
rank asks. With the torch backends the side channel is the mpi4py communicator the torch group
was made over; gloo and nccl release the GIL while they wait, so the thread runs. A stalled
rank's own thread keeps answering (a Python ``sleep`` or loop releases the GIL); a killed one
cannot, and is named as not answering.

The messages (tags below) are JSON, never pickle, and small, except a rank's call history, sent
once when a mismatch is being pinned down:

* ``REQ`` -> ``STATUS``: "where are you?", answered with :meth:`Watchdog.status` (stacks included);
* ``LEFT``: a rank's last status as it exits (normally or early), to every rank;
* ``CHECK``: a rank's newest kept CRC of its collective calls, to rank 0, which compares;
* ``HIST_REQ`` -> ``HIST``: that rank's kept CRCs and calls, to find the first that differed.
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
import time

from .stallreport import mismatch_report, rank_labels, stall_report

REQ, STATUS, LEFT, CHECK, HIST_REQ, HIST = range(1, 7)  # side-channel tags
ANSWER_WAIT = 4.0  # seconds to wait for the others' answers: a loaded host (ranks sharing cores) can take 2


def side_comm(comm):
    """The mpi4py communicator under ``comm`` (an MPIComm's, or the one a torch group was made over)."""
    from mpi4py import MPI

    for attr in ("comm", "mpi"):
        c = getattr(comm, attr, None)
        if isinstance(c, MPI.Comm):
            return c
        if c is not None and isinstance(getattr(c, "comm", None), MPI.Comm):
            return c.comm
    return None


class Monitor:
    """The thread beside one rank's :class:`Watchdog` ``wd``; ``start()`` returns None where it cannot run."""

    def __init__(self, wd, side):
        self.wd, self._side = wd, side.Dup()  # collective: every rank builds its watchdog at the same point
        self._replies: dict[int, dict] = {}
        self._left: dict[int, dict] = {}
        self._theirs: dict[int, tuple] = {}  # rank 0: the newest (seq, crc) of each rank
        self._sends: list = []
        # Messages sent to and received from each rank, so that close() can receive every one.
        self._sent_to, self._got_from = [0] * wd.size, [0] * wd.size
        self._sent_check = None
        self._mismatch_reported = False
        self._stop = threading.Event()
        # Set as the thread's loop ends: what close() and _leave() wait for, rather than the thread's
        # end, which under Intel MPI (ranks on fewer cores) has come long after its last Python line.
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="mpi_sgd-watchdog", daemon=True)

    @classmethod
    def start(cls, wd) -> Monitor | None:
        from mpi4py import MPI

        side = side_comm(wd.inner)
        if side is None:
            return None
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            if wd.rank == 0:
                sys.stderr.write("mpi_sgd watchdog: MPI was not started with MPI_THREAD_MULTIPLE; stall checks off\n")
            return None
        monitor = cls(wd, side)
        monitor.thread.start()
        atexit.register(monitor._leave)
        return monitor

    def close(self) -> None:
        """Stop the thread and free the side channel (collective), every message on it received first.

        MPI gives a freed communicator's context to the next one made, and a message left behind on
        it (an answer that came after its asker stopped waiting, a CHECK) would be matched by a
        receive on that new communicator: a later receive from any source, in torch's group or the
        user's, would get this channel's JSON as its data. So the ranks first tell each other how
        many messages each sent each, and receive exactly that many.
        """
        atexit.unregister(self._leave)
        self._stop.set()
        self._wait_for_thread(ANSWER_WAIT + 2 * self.wd.poll + 5)
        owed = self._side.alltoall(self._sent_to)  # owed[r]: how many rank r sent me
        while any(got < n for got, n in zip(self._got_from, owed, strict=True)):
            self._serve(block=True)
        for req, _ in self._sends:
            req.Wait()
        self._sends = []
        self._side.Free()

    def _wait_for_thread(self, limit: float, quiet: bool = False) -> None:
        """Wait up to ``limit`` s for the thread's loop to end, then go on without it, saying why.

        The loop ends within one poll of being told to, or ANSWER_WAIT later if it was asking
        the others; ``limit`` covers both, so a thread still in Python by then is not merely slow.
        Under Intel MPI, with three ranks on two cores, a rank's watchdog thread has vanished
        without running its ``finally`` (faulthandler no longer listed it, and the loop's event was
        never set): waiting for it had no end. What the OS says of the thread is printed, so that
        the next time it happens says more."""
        if self._done.wait(limit) or quiet:
            return
        sys.stderr.write(
            f"mpi_sgd watchdog on rank {rank_labels(self.wd.world_ranks)(self.wd.rank)}: its thread has not "
            f"finished {limit:.0f} s after being told to stop ({_os_view(self.thread)}); going on without it\n"
        )

    def _send(self, dest: int, tag: int, payload) -> None:
        from mpi4py import MPI

        data = json.dumps(payload).encode()
        self._sends.append((self._side.Isend([data, MPI.BYTE], dest, tag), data))
        self._sent_to[dest] += 1

    def _serve(self, block: bool = False) -> None:
        """Answer what the other ranks' threads sent; drop finished sends. ``block``: receive one
        message, waiting for it, and only that (:meth:`close` draining the channel)."""
        from mpi4py import MPI

        self._sends = [(r, d) for r, d in self._sends if not r.Test()]
        status = MPI.Status()
        while block or self._side.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            if block:
                self._side.Probe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            src, tag = status.Get_source(), status.Get_tag()
            data = bytearray(status.Get_count(MPI.BYTE))
            self._side.Recv([data, MPI.BYTE], src, tag)
            self._got_from[src] += 1
            if block:
                return
            msg = json.loads(data)
            if tag == REQ:
                self._send(src, STATUS, self.wd.status())
            elif tag == STATUS:
                self._replies[src] = msg
            elif tag == LEFT:
                self._left[src] = msg
            elif tag == CHECK:
                self._theirs[src] = tuple(msg)
            elif tag == HIST_REQ:
                self._send(src, HIST, {"checks": list(self.wd.checks), "calls": self.wd.history()})
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
            while not self._stop.wait(self.wd.poll):
                self._serve()
                self._check_calls()
                blocked = self.wd.blocked
                if blocked is None:
                    continue
                waited = time.monotonic() - blocked[2] - self.wd.patience  # a save's own deadline first
                if waited >= self.wd.timeout and reported != blocked:
                    reported = blocked
                    self._report_stall()
                if self.wd.abort_after and waited >= self.wd.abort_after and reported == blocked:
                    self._abort()
        except Exception as e:  # the watchdog must never be what breaks a job
            sys.stderr.write(
                f"mpi_sgd watchdog on rank {rank_labels(self.wd.world_ranks)(self.wd.rank)} stopped: {e!r}\n"
            )
        finally:
            self._done.set()

    def _report_stall(self) -> None:
        me = self.wd.status()
        if me["blocked"] is None:
            return  # the call returned meanwhile
        others = [r for r in range(self.wd.size) if r != self.wd.rank and r not in self._left]
        answers = {**self._left, **self._ask(others)}
        # One report per stall: the lowest rank that has waited as long reports; the rest defer to it.
        for r, s in answers.items():
            if r < self.wd.rank and s and s["blocked"] and s["blocked"][2] >= self.wd.timeout - 2 * self.wd.poll:
                return
        self.wd.report(stall_report(me, answers, self.wd.timeout, self.wd.world_ranks))

    def _check_calls(self) -> None:
        """The always-on mismatch check: every rank's newest kept CRC against rank 0's."""
        if self.wd.rank != 0:
            if self.wd.checks and self.wd.checks[-1][0] != self._sent_check:
                self._sent_check = self.wd.checks[-1][0]
                self._send(0, CHECK, list(self.wd.checks[-1]))
            return
        if self._mismatch_reported:
            return  # once is enough: the abort that follows ends the job
        mine = dict(self.wd.checks)
        for r, (seq, crc) in list(self._theirs.items()):
            if seq in mine or not self.wd.checks or seq < self.wd.checks[0][0]:
                del self._theirs[r]  # compared now, or older than what rank 0 keeps
                if mine.get(seq, crc) != crc:
                    self._report_mismatch(r, self._ask([r], HIST_REQ)[r])

    def _report_mismatch(self, rank: int, theirs: dict | None) -> None:
        """Print the first call that differed between rank 0 and ``rank`` (from its history), and abort."""
        name = rank_labels(self.wd.world_ranks)
        text = f"mpi_sgd watchdog: rank {name(rank)}'s collective calls differ from rank {name(0)}'s"
        if theirs:
            mine = {c[0]: c for c in self.wd.history()}
            differ = sorted(c[0] for c in theirs["calls"] if c[0] in mine and mine[c[0]][2] != c[2])
            if differ:
                first = next(c for c in theirs["calls"] if c[0] == differ[0])
                text = mismatch_report(differ[0], {0: list(mine[differ[0]]), rank: first}, self.wd.world_ranks)
            else:
                text += f": rank {name(0)} made {self.wd.seq} collective calls, rank {name(rank)} {theirs['seq']}"
        self.wd.report(text)
        self._mismatch_reported = True
        self._abort()

    def _abort(self) -> None:
        time.sleep(0.5)  # let the launcher forward the report before the abort tears its pipes down
        self.wd.inner.abort(1)

    def _leave(self) -> None:
        """At exit: stop the thread and tell the others, so a rank that returned early is named.

        Every rank then waits (ANSWER_WAIT at most) for every other rank's last word: a message left
        unreceived at MPI_Finalize makes UCX warn of an "unexpected tag-receive descriptor" as a job
        that worked ends. Rank 0 compares their running CRCs with its own: a mismatch the periodic
        check had no time to see still fails the job.
        """
        self._stop.set()
        self._wait_for_thread(2 * self.wd.poll + 1, quiet=True)
        try:
            me = {**self.wd.status(stack=False), "left": True, "crc": self.wd.crc}
            for r in range(self.wd.size):
                if r != self.wd.rank:
                    self._send(r, LEFT, {**me, "calls": self.wd.history(512)} if r == 0 else me)
            deadline = time.monotonic() + ANSWER_WAIT
            while len(self._left) < self.wd.size - 1 and time.monotonic() < deadline:
                time.sleep(0.005)
                self._serve()
            for r, s in sorted(self._left.items()):
                if self.wd.rank == 0 and (s["seq"], s["crc"]) != (self.wd.seq, self.wd.crc):
                    self._report_mismatch(r, s)
            while self._sends and time.monotonic() < deadline:
                self._sends = [(r, d) for r, d in self._sends if not r.Test()]
            self._serve()  # anything that arrived meanwhile (a late answer) is received, not left
        except Exception:
            pass  # MPI may already be going down; leaving quietly is all that is left


def _os_view(thread: threading.Thread) -> str:
    """What Python and the kernel say of ``thread``: alive or not, and its OS thread's state."""
    said = f"Python: {'alive' if thread.is_alive() else 'ended'}"
    tid = getattr(thread, "native_id", None)
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]  # the field after the command's name
        with open(f"/proc/self/task/{tid}/wchan") as f:
            wchan = f.read().strip() or "-"
        return f"{said}; OS thread {tid}: state {state}, waiting in {wchan}"
    except (OSError, IndexError):
        return f"{said}; OS thread {tid}: gone"
