"""How the ranks of a node wait for each other in shared memory: counters, fences, bounded waits.

Ranks tell each other how far they got through counters in a small control window: each rank owns
one page of it, which only that rank writes, holding one monotonic counter per kind of event
(arrived, reduced, ...). "Rank q has done step k" reads ``counter[q] >= k``.

**Memory ordering** follows the unified memory model of MPI's one-sided chapter, in which
``MPI_Win_sync`` is a memory barrier (MPICH issues a processor fence): a writer stores its data,
calls ``Win_sync`` and then stores the counter (one aligned 8-byte store, atomic on every 64-bit
CPU); a reader loads the counter, calls ``Win_sync`` and then loads the data. The two barriers pair
up like release and acquire: a rank that sees the counter also sees the data written before it.
On x86 the hardware keeps those orders anyway; on Arm or POWER the barriers are what make it right.

**Every wait is bounded.** A waiting rank spins, then yields its core on every poll. If the job's
ranks outnumber the host's cores, the awaited rank may need this very core, so it yields after
a few polls. If not, it spins for up to :data:`SPIN_SECONDS` first: the awaited rank most likely
runs on another core and is nearly there, and a yield could hand this core to another program
for a whole scheduler slice. Not longer: on a host shared with other work the awaited rank may
be waiting for this very core all the same, and then every wait costs the whole spin (a spin of
a few thousand polls made the all-reduce several times slower on a loaded host than yielding at
once). While it waits it also enters MPI every few polls (an ``Iprobe``, well under a microsecond):
the rank it waits for may itself be waiting for an MPI request of this rank (a bucket below the
shared path's threshold), and a non-blocking collective's later rounds move only when each rank
enters MPI, so a wait that never did could wait for ever. It checks every 10 ms that the ranks it
waits for still exist (pids exchanged at start-up; a few microseconds), and gives up after
``timeout`` seconds (``MPI_SGD_SHM_TIMEOUT``, default 300). Either way it raises
:class:`StalledRankError` naming them. Where the launcher leaves the other ranks running after
one ends (hydra's ``mpiexec -disable-auto-cleanup`` when a rank *exits* without ``MPI_Finalize``;
Slurm's ``srun`` without ``--kill-on-bad-exit``) this is what ends the job, instead of a spin that
never returns. Where it does not, the launcher gets there first and names no rank: hydra's proxy
SIGKILLs every other rank of its host as soon as it reaps one that died *by a signal*, with or
without ``-disable-auto-cleanup``, which takes a few milliseconds (it wakes when the dead rank's
output pipes close), so a survivor names the rank only if its own check happens to come first.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from ...launch import PeerGone, usable_cores
from .settings import timeout_setting
from .window import free_window, shared_window

# Control block of each rank (int64 words): event counters, then descriptors of calls in flight.
CONTROL_WORDS = 512  # one 4 KiB page per rank: no two ranks ever write the same cache line
ARRIVED, REDUCED, READY, COPIED = range(4)
DESC_BASE, DESC_WORDS = 8, 4
SLOTS = (CONTROL_WORDS - DESC_BASE) // DESC_WORDS  # calls in flight at most
LIVENESS_EVERY = 0.01  # seconds between checks that awaited ranks still exist
CLOCK_EVERY = 16  # polls between clock readings
SPIN_SECONDS = 50e-6  # how long a waiting rank spins before it yields, when ranks do not outnumber cores
QUICK_POLLS = 256  # bare polls of one counter before a wait turns to spin() (a few microseconds)


class StalledRankError(RuntimeError):
    """Ranks this one waited for did not get there: they died, or stalled past the timeout."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class RankExitedError(StalledRankError, PeerGone):
    """Ranks this one waited for have exited: the witness of their failure, not its cause."""


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a killed child its launcher has not reaped yet is a zombie: gone all the same
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


class NodeSync:
    """Counters on ``node`` (one control page per rank) and the waits on them. Collective over ``node``.

    ``world_ranks[q]`` names node rank q in messages; ``timeout`` is the longest wait in seconds;
    ``host_ranks`` is how many ranks of the job share this host (``node`` may be a part of them).
    """

    def __init__(
        self,
        node: MPI.Comm,
        world_ranks: list[int],
        timeout: float | None = None,
        host_ranks: int = 1,
        name: str = "shared-memory all-reduce",
    ):
        self.timeout, self.name = timeout_setting(timeout), name  # the name starts every message
        self.spin_seconds = 0.0 if max(host_ranks, node.Get_size()) > usable_cores() else SPIN_SECONDS
        self.rank, self.world_ranks = node.Get_rank(), world_ranks
        self.node = node
        me = (os.getpid(), _pid_namespace())
        # A pid means something only inside our own pid namespace; elsewhere the timeout has to do.
        self.pids = {world_ranks[q]: pid for q, (pid, ns) in enumerate(node.allgather(me)) if ns and ns == me[1]}
        self.win, views = shared_window(node, CONTROL_WORDS, np.int64)
        # memoryviews: a scalar read or write costs a fraction of numpy's, and polls are many
        self.flags = [memoryview(v) for v in views]
        views[self.rank][:] = 0
        node.Barrier()  # nobody reads a counter before its owner has zeroed it

    def fence(self, win: MPI.Win) -> None:
        """Memory barrier: ``MPI_Win_sync`` on the window whose memory was accessed (see above)."""
        win.Sync()

    def signal(self, counter: int, seq: int) -> None:
        """Tell the node this rank reached ``seq`` in ``counter``; call after :meth:`fence`."""
        self.flags[self.rank][counter] = seq

    def post(self, seq: int, *words: int) -> tuple:
        """Write call ``seq``'s descriptor (DESC_WORDS words, ``seq`` first) into this rank's slot for it."""
        mine, slot = self.flags[self.rank], DESC_BASE + (seq % SLOTS) * DESC_WORDS
        desc = (seq, *words)
        for i, word in enumerate(desc):
            mine[slot + i] = word
        return desc

    def descriptor(self, seq: int, q: int) -> list[int]:
        slot = DESC_BASE + (seq % SLOTS) * DESC_WORDS
        return self.flags[q][slot : slot + DESC_WORDS].tolist()

    def differs(self, seq: int, desc: tuple, ranks) -> bool:
        """Whether any of node ranks ``ranks`` posted another descriptor than ``desc`` for call ``seq``."""
        slot = DESC_BASE + (seq % SLOTS) * DESC_WORDS
        return any(tuple(self.flags[q][slot : slot + DESC_WORDS]) != desc for q in ranks)

    def behind(self, counter: int, seq: int, ranks) -> list[int]:
        """The world ranks among node ranks ``ranks`` whose ``counter`` has not reached ``seq``."""
        flags, world = self.flags, self.world_ranks
        return [world[q] for q in ranks if flags[q][counter] < seq]

    def wait_for(self, counter: int, seq: int, ranks, what: str) -> None:
        """Return once every node rank in ``ranks`` has ``counter`` >= ``seq`` (bounded, as :meth:`spin`)."""
        flags = self.flags
        for q in ranks:
            if flags[q][counter] < seq:
                # A peer a few microseconds behind is seen sooner by this bare loop (tens of ns a
                # poll) than by spin()'s (about a microsecond a poll); when ranks outnumber cores
                # (spin_seconds 0) the core is given up at once instead.
                theirs = flags[q]
                for _ in range(QUICK_POLLS if self.spin_seconds else 0):
                    if theirs[counter] >= seq:
                        break
                else:
                    self.spin(lambda: self.behind(counter, seq, ranks), f"{what} #{seq}")
                    return

    def spin(self, missing, what: str) -> None:
        """Poll ``missing()`` (world ranks still awaited) until empty; raise after a death or the timeout."""
        start = time.monotonic()
        next_check, polls, spinning = start + LIVENESS_EVERY, 0, True
        while True:
            behind = missing()
            if not behind:
                return
            polls += 1
            if polls % CLOCK_EVERY == 0:  # the clock is read once every few polls
                self.node.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)  # drives this rank's MPI requests (see above)
                now = time.monotonic()
                if now >= next_check:
                    self._check_alive(behind, what)
                    next_check = now + LIVENESS_EVERY
                if now - start > self.timeout:
                    raise StalledRankError(
                        f"{self.name}: waited {self.timeout:g} s for rank(s) "
                        f"{', '.join(map(str, behind))} {what}; they are alive but not taking part (stuck "
                        "elsewhere, or calling collectives in another order). MPI_SGD_SHM_TIMEOUT sets the limit.",
                        list(behind),
                    )
                if now - start > 0.05:
                    time.sleep(2e-4)  # a long wait (a peer still in its forward pass): stop burning the core
                spinning = now - start < self.spin_seconds
            if not spinning:
                os.sched_yield()

    def _check_alive(self, ranks, what: str) -> None:
        gone = [r for r in ranks if r in self.pids and _dead(self.pids[r])]
        if gone:
            names = ", ".join(f"{r} (pid {self.pids[r]})" for r in gone)
            raise RankExitedError(f"{self.name}: rank(s) {names} exited while this rank waited for them {what}", gone)

    def close(self) -> None:
        self.flags.clear()
        free_window(self.win)
