"""A save (or a read) with a deadline of its own, which the stall watchdog never takes for a stall.

Only the root writes a checkpoint; the other ranks would go on to the next step's all-reduce and
wait there while it writes, and a write longer than ``--stall-timeout`` (a large model, slow
storage) would look to their watchdogs like a dead rank 0. So a save is a collective section that
every rank enters at the same point (the end of :func:`~mpi_sgd.checkpoint.save_training`'s
gathers): the root writes from a thread of its own and waits for it at most ``--save-timeout``
seconds; every rank then takes the outcome in one broadcast, during which each watchdog (see
:meth:`~mpi_sgd.comm.wrappers.watchdog.Watchdog.patient`) is patient for the save's deadline plus
:data:`MARGIN`. The other ranks wait for the root in a barrier they poll, sleeping between polls
(:func:`~mpi_sgd.comm.polling.wait_idle`): a blocking MPI call would spin for the whole write on
a core of its own, and where ranks share cores it takes time from the root that writes.

Reading a checkpoint to resume is the same section the other way round: the root reads and
verifies the file while the others wait for the bytes (:func:`mpi_sgd.checkpoint.load`), within
the same deadline.

The root alone decides that a save has hung, names its path and ends the job; a save that fails
(a full disk) reaches every rank as the same one-line :class:`~mpi_sgd.checkpoint.store.CheckpointError`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from ..comm.polling import Backoff, wait_idle
from .store import CheckpointError

MARGIN = 30.0  # seconds the waiting ranks allow beyond the deadline, so that the root's verdict comes first
HUNG_STATUS = 1  # the status of a job ended by a hung save (as a stall's)


def _watchdogs(comm):
    """The :class:`~mpi_sgd.comm.wrappers.watchdog.Watchdog` s in ``comm``'s chain of wrappers (by
    their instance attribute: a wrapper's ``__getattr__`` would find any inner one's)."""
    while comm is not None:
        if "patience" in vars(comm):
            yield comm
        comm = vars(comm).get("inner")


def run(comm, write, what: str, timeout: float, root: int = 0, kind: str = "save"):
    """Call ``write()`` on ``root`` (``what``: "saving step N to DIR", for messages) within
    ``timeout`` seconds (0: no limit); every rank returns its result's outcome alike.

    Returns what ``write`` returned on the root (None elsewhere); raises :class:`CheckpointError`
    on every rank if it raised one. A call still running after ``timeout`` is reported as a hung
    ``kind`` ("save" or "read") and the job is aborted.
    """
    patience = timeout + MARGIN if timeout > 0 else float("inf")
    with contextlib.ExitStack() as stack:
        for wd in _watchdogs(comm):
            stack.enter_context(wd.patient(patience))
        result, failure = _on_root(comm, write, what, timeout, kind) if comm.rank == root else (None, None)
        # The root enters the barrier when its write is over; past the watchdog's patience the
        # wait becomes a blocking one, which the watchdog watches and reports.
        written = comm.ibarrier()
        if not wait_idle(written, patience, Backoff(spins=100, cap=0.005)):
            written.wait()
        failure = comm.bcast_obj(failure, root)
    if failure:
        raise CheckpointError(failure)
    return result


def _on_root(comm, write, what: str, timeout: float, kind: str):
    done: dict = {}
    finished = threading.Event()

    def body():
        try:
            done["result"] = write()
        except CheckpointError as e:
            done["failure"] = str(e)
        except Exception as e:  # noqa: BLE001 (any failure is told to every rank, in one line)
            done["failure"] = f"{what} failed: {e!r}"
        finally:
            finished.set()

    started = time.monotonic()
    thread = threading.Thread(target=body, name=f"checkpoint-{kind}", daemon=True)
    thread.start()
    # Wait for the write, not for the thread's end: under Intel MPI, three ranks on two cores, a
    # root once waited in join() for a save thread that was no longer in Python (faulthandler
    # listed no such thread) while the others waited for its verdict, until the test's timeout.
    if not finished.wait(timeout if timeout > 0 else None):
        stays = ", the previous checkpoint stays" if kind == "save" else ""
        print(
            f"checkpoint {kind} hung: {what} has not finished after {time.monotonic() - started:.0f} s "
            f"(--save-timeout {timeout:g}); ending the job{stays}",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(0.5)  # let the launcher forward the line before the abort tears its pipes down
        comm.abort(HUNG_STATUS)
    return done.get("result"), done.get("failure")
