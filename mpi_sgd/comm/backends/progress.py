"""Completing MPI requests behind torch's back: progress threads per process.

MPICH and Open MPI (without their own progress threads) move a non-blocking operation along only
while some thread of the process is inside an MPI call. :class:`~mpi_sgd.gradsync.BucketedAllReduce`
polls from its own autograd hooks and then waits. A torch process group cannot: DDP starts each
bucket's all-reduce from C++, takes the work's future, and at the end of backward waits on those
futures in C++, where no Python of ours runs. Completing the future inside ``get_future()`` (the
simplest thing) makes backward stop at every bucket until its all-reduce is done: DDP's buckets
are serialised. So another thread has to sit in MPI while the caller computes:

* The *waiter* thread takes the oldest pending work and blocks in ``MPI_Waitall`` on its requests,
  then runs its finishing step (the division of an average, say) and completes its future, which
  is what DDP waits on; then the next. Works complete in the order they started, as DDP's buckets
  and most programs expect. Any thread inside MPI advances every outstanding operation, so later
  works move on meanwhile.
* ``MPI_Waitall`` rather than ``MPI_Waitsome`` over all pending requests plus a wake-up request:
  under ``MPI_THREAD_MULTIPLE`` MPICH's ``Waitsome`` gives up its lock and the CPU
  (``sched_yield``) on every turn of its polling loop, and on a host with more runnable threads
  than cores that made a 7.5 MB all-reduce two to three times slower than ``Wait``.
* Blocking on the oldest work alone could deadlock a program whose older request (a receive,
  say) completes only after it has acted on a newer one. The *sweeper* thread prevents that: while
  the waiter is busy, it tests the newer works (``MPI_Testall``, which only looks, since the
  waiter's ``Wait`` already advances them) and completes those that are done, first after
  0.2 ms, then ever less often, up to every 10 ms (:data:`SWEEP_S`). Otherwise it sleeps, waking
  once a second (:data:`IDLE_LOOK_S`, or sooner for a shorter timeout) to fail works older than
  their group's timeout with an error naming the call and rank.
* A blocking call (torch's ``async_op=False``: torch calls ``wait()`` straight after) needs no
  other thread at all: its own thread polls its requests in ``wait()`` (``MPI_Testall``), so a
  small all-reduce costs no thread wake-up. Still running after :data:`CALLER_POLL_S`, it is
  handed to the waiter if that is idle, whose ``Wait`` moves large messages faster.
* Each thread holds the GIL only between MPI calls (mpi4py releases it inside them), so Python on
  the caller's thread is not slowed; but ``MPI_Waitall`` polls, so while anything is in flight the
  waiter keeps a core busy. MPICH's own progress thread (``MPIR_CVAR_ASYNC_PROGRESS=1``) would spin
  for the whole life of the job instead.
* **Priority.** Both threads run at the lowest priority (nice 19). Where a core per rank is free,
  that changes nothing: the waiter runs there, and the all-reduce advances while backward
  computes, which is the overlap DDP is after. Where ranks already fill every core (two ranks on
  two cores), no overlap is possible, and a waiter spinning at equal priority would only take
  turns with backward on the same core; at nice 19 it yields to the computing thread and takes
  the core the moment that thread blocks, in DDP's wait at the end of backward. (Linux applies
  nice per thread, and with autogroup scheduling only within the job, so other users' processes
  are not its competitors.) Measured with ``mpi-sgd bench sgd``, it narrowed the gap to the
  bucketed strategy on a loaded two-core host.

A request is completed by one thread only (MPI forbids two threads completing one request): a
work is *claimed* by the waiter, the sweeper or its caller before any of them touches it. All of
this needs ``MPI_THREAD_MULTIPLE``, which mpi4py asks for by default. The work itself, what torch
waits on, is :class:`~.mpi4py_work.MPIWork`; it waits under this module's lock and is settled here.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
from collections.abc import Callable

from mpi4py import MPI

from .mpi4py_work import INF, MPIWork, overdue_error

SWEEP_S = (0.0002, 0.01)  # the sweeper looks at works the waiter has not reached this often: first, at most
IDLE_LOOK_S = 1.0  # with nothing to look at, the sweeper still checks deadlines this often
CALLER_POLL_S = 0.001  # a caller polls its own work this long before handing it to an idle waiter


class Progress:
    """The waiter and the sweeper of this process (see the module docstring)."""

    def __init__(self):
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise RuntimeError(
                "the mpi4py torch backend needs MPI_THREAD_MULTIPLE (its progress thread calls MPI while "
                f"yours does), but MPI was initialised with thread level {MPI.Query_thread()}; do not lower "
                "mpi4py.rc.thread_level"
            )
        self.lock = threading.Lock()
        # One lock; new work wakes the waiter if it is idle, the sweeper if not; a finished work
        # wakes whoever waits for it in Python.
        self._for_waiter, self._for_sweeper = threading.Condition(self.lock), threading.Condition(self.lock)
        self.done_cv = threading.Condition(self.lock)
        self._pending: list[MPIWork] = []  # in the order they started
        self._waiter_busy = False
        self._sweeper_until = INF  # when the sweeper looks next unless woken
        self._stopping = False
        self._broken: BaseException | None = None
        # Opt-in (None: nothing kept): (work number, "start" | "waiter" | "mpi-done" | "settled",
        # perf_counter) as each work moves on; ``mpi-sgd bench ddp`` draws DDP's step from it.
        self.trace: list | None = None
        self._numbers = itertools.count()  # each work's, in the order they are submitted
        self._threads = [
            threading.Thread(target=self._guarded, args=(self._wait_loop,), name="mpi4py-waiter", daemon=True),
            threading.Thread(target=self._guarded, args=(self._sweep_loop,), name="mpi4py-sweeper", daemon=True),
        ]
        for t in self._threads:
            t.start()
        # Before mpi4py finalises MPI at exit (our atexit hook runs first: registered later).
        atexit.register(self.stop)

    def _guarded(self, loop) -> None:
        """A progress thread that dies would leave every later wait hanging: fail loudly instead."""
        try:
            _lowest_priority()
            loop()
        except BaseException as e:
            with self.lock:
                self._broken, self._stopping, failed = e, True, list(self._pending)
                self._pending.clear()
            for w in failed:
                self.settle(w, RuntimeError(f"mpi4py backend: {w.name} abandoned: a progress thread failed: {e!r}"))
            raise

    def submit(self, work: MPIWork) -> MPIWork:
        if self._broken is not None:
            raise RuntimeError(f"mpi4py backend: {work.name}: a progress thread failed: {self._broken!r}")
        if self._stopping:
            raise RuntimeError(f"mpi4py backend: {work.name} started after shutdown")
        work.progress, work.number = self, next(self._numbers)
        self._note(work, "start")
        if work.owner != "caller":
            with self.lock:
                self._list(work)
        return work

    def _note(self, work: MPIWork, what: str) -> None:
        if self.trace is not None:
            self.trace.append((work.number, what, time.perf_counter()))

    def _list(self, work: MPIWork) -> None:  # with the lock held
        self._pending.append(work)
        work.listed = True
        if work.deadline < self._sweeper_until or self._waiter_busy:
            self._for_sweeper.notify()
        if not self._waiter_busy:
            self._for_waiter.notify()

    def drive(self, work: MPIWork, deadline: float) -> None:
        """A blocking call's own thread polls its work (no hand-off, so no thread to wake for a
        small message); if it is still running after :data:`CALLER_POLL_S` and the waiter is idle,
        the waiter takes it over (its ``Wait`` moves large messages faster than polling does)."""
        hand_over_at = time.monotonic() + CALLER_POLL_S
        try:
            while not MPI.Request.Testall(work.requests, work.statuses):
                now = time.monotonic()
                if now > deadline:
                    return  # wait() says so
                if now > hand_over_at:
                    with self.lock:
                        if not self._waiter_busy:
                            work.owner = None
                            self._list(work)
                            return
                    hand_over_at = now + CALLER_POLL_S
        except MPI.Exception as e:
            self.settle(work, e)
        else:
            self._note(work, "mpi-done")
            self.settle(work, None)

    def settle(self, work: MPIWork, error: BaseException | None) -> None:
        """Finish ``work`` exactly once: its finishing step, then everyone waiting on it."""
        with self.lock:
            if work.settling:
                return
            work.settling = True
            if work.listed:
                self._pending.remove(work)
        if error is not None and not isinstance(error, RuntimeError):
            error = RuntimeError(f"mpi4py backend: {work.name} failed: {error}")
        if error is None and work._finish is not None:
            try:
                work._finish()
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                error = e
        with self.lock:
            work._error, work._finish, work._keep, work.done = error, None, None, True
            fut = work._future
            self.done_cv.notify_all()
        # Outside the lock: a future's callbacks may start new work (DDP communication hooks do).
        if fut is not None:
            work._complete_future(fut)
        self._note(work, "settled")

    def stop(self, timeout: float = 2.0) -> None:
        """Let both threads finish (a waiter stuck on a request that never completes is left)."""
        with self.lock:
            self._stopping = True
            self._for_waiter.notify()
            self._for_sweeper.notify()
        for t in self._threads:
            t.join(timeout)

    def _oldest_unclaimed(self) -> MPIWork | None:
        return next((w for w in self._pending if w.owner is None), None)

    def _wait_loop(self) -> None:
        while True:
            with self.lock:
                self._waiter_busy = False
                while not self._stopping and (work := self._oldest_unclaimed()) is None:
                    self._for_waiter.wait()
                if self._stopping:
                    return
                work.owner, self._waiter_busy = "waiter", True
                if self._oldest_unclaimed() is not None:
                    self._for_sweeper.notify()  # more behind this one: the sweeper watches them
            self._note(work, "waiter")
            try:
                MPI.Request.Waitall(work.requests, work.statuses)
            except MPI.Exception as e:
                self.settle(work, e)
            else:
                self._note(work, "mpi-done")
                self.settle(work, None)

    def _sweep_loop(self) -> None:
        interval = SWEEP_S[0]
        while True:
            with self.lock:
                if self._stopping:
                    return
                now = time.monotonic()
                overdue = [w for w in self._pending if w.deadline < now]
                # Only while the waiter is busy: otherwise it takes new works itself at once.
                mine = [w for w in self._pending if w.owner is None] if self._waiter_busy else []
                for w in mine:
                    w.owner = "sweeper"
            for w in overdue:
                self.settle(w, overdue_error(w.name, w.timeout_s))
            done = 0
            for w in mine:
                try:
                    finished = MPI.Request.Testall(w.requests, w.statuses)
                except MPI.Exception as e:
                    self.settle(w, e)
                    continue
                if finished:
                    done += 1
                    self._note(w, "mpi-done")
                    self.settle(w, None)
                else:
                    with self.lock:
                        w.owner = None
                        if not self._waiter_busy:
                            self._for_waiter.notify()
            with self.lock:
                if self._stopping:
                    return
                now = time.monotonic()
                if mine:
                    # Look again soon, then less and less often while nothing finishes: the common
                    # case (works finishing in order) costs a few looks, a long wait little more.
                    interval = SWEEP_S[0] if done else min(2 * interval, SWEEP_S[1])
                    self._sweeper_until = now + interval
                else:
                    interval = SWEEP_S[0]
                    self._sweeper_until = min([w.deadline for w in self._pending] + [now + IDLE_LOOK_S])
                self._for_sweeper.wait(max(0.0, self._sweeper_until - now))


def _lowest_priority() -> None:
    """Run this thread at nice 19 (Linux sets it per thread): see "Priority" in the module docstring."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # another OS: normal priority, still correct
        pass


_progress: Progress | None = None
_progress_lock = threading.Lock()


def engine() -> Progress:
    """This process's progress threads, started on first use."""
    global _progress
    with _progress_lock:
        if _progress is None:
            _progress = Progress()
        return _progress


def submit(
    name: str,
    requests,
    result: list,
    finish: Callable | None = None,
    keep=None,
    timeout=None,
    caller_waits: bool = False,
    statuses: bool = False,
) -> MPIWork:
    """Hand started ``requests`` to the progress threads; returns the torch Work that completes with them.

    ``caller_waits``: a blocking call (torch's ``async_op=False``), whose thread calls ``wait()`` at
    once; ``statuses``: keep each request's status (a receive from any source reads its sender).
    """
    timeout_s = timeout.total_seconds() if timeout else INF
    return engine().submit(MPIWork(name, requests, result, finish, keep, timeout_s, caller_waits, statuses))
