"""Fault injection: make one rank fail on purpose, to show that the job ends and says why.

``MPI_SGD_FAULT=rank:step:kind`` (e.g. ``1:20:stall``) makes rank ``rank`` misbehave when the
training loop starts the forward pass of step ``step`` (steps count from 1; see
``Communicator.where``). The kinds are the ways ranks fail in real jobs:

=========  ==========================================================================================
raise      an exception (a bug, a bad file): the abort hook ends the job naming rank, host, traceback
kill       SIGKILL (the OOM killer, a lost node): the launcher ends the job
stall      sleeps for ever (a deadlock, a hung filesystem): the other ranks' watchdogs report it
nan        this step's next gradient all-reduce sends NaN from this rank: the loss stops being finite
shape      this step's next gradient all-reduce is one element short on this rank: a mismatch
exit0      leaves the loop with status 0, as a rank that returns early without an error would
=========  ==========================================================================================

Before it acts, the rank prints one line with the wall-clock time of the fault, so a test can
measure how long the job took to end after it (``mpi-sgd faults`` does). :class:`FaultComm` is a
wrapper like the others: ``comm.init`` puts it outermost when the variable is set, so the
watchdog below it sees the faulty calls as they reach MPI.

**Which rank, in a split communicator.** The ``rank`` of a fault is a rank of the *job*: its rank
in the communicator the :class:`FaultComm` was first put around, the world under ``comm.init``.
Each part of a split keeps the fault and that number, so the fault strikes the same process in
whichever part, whatever its rank there; and one process has one fault: it fires once, at the
first ``where("forward", step)`` any of its communicators hears, and a ``nan`` or ``shape`` it arms
spoils the next all-reduce this process makes on any of them.

A NaN injected inside the all-reduce looks, to every rank, like corruption in transit: each rank's
own gradients were finite when checked. So :attr:`FaultComm.tampered` says what this wrapper did to
the data; the trainer's non-finite stop reads it (``getattr(comm, "tampered", None)``, None on every
other communicator) to name the rank, as it names a rank whose own gradient was not finite.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from .wrapper import CommWrapper

KINDS = ("raise", "kill", "stall", "nan", "shape", "exit0")
ANNOUNCE = "mpi_sgd fault:"  # the line's prefix; the wall-clock time of the fault ends it


@dataclass
class _Shot:
    """What one process has done about its fault: shared by a FaultComm and every part split off it."""

    step: int | None = None
    armed: str | None = None  # "nan" or "shape": the next all-reduce's
    fired: bool = False
    tampered: str | None = None


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str

    @classmethod
    def parse(cls, text: str) -> Fault:
        """'1:20:stall' -> Fault(1, 20, 'stall'); ValueError naming what is wrong."""
        parts = text.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            raise ValueError(f"MPI_SGD_FAULT must read rank:step:kind, e.g. 1:20:stall; got {text!r}")
        if parts[2] not in KINDS:
            raise ValueError(f"MPI_SGD_FAULT kind {parts[2]!r} is not one of {', '.join(KINDS)}")
        if int(parts[1]) < 1:
            raise ValueError(f"MPI_SGD_FAULT step counts from 1; got {text!r}")
        return cls(int(parts[0]), int(parts[1]), parts[2])

    def __str__(self) -> str:
        return f"{self.rank}:{self.step}:{self.kind}"


class FaultComm(CommWrapper):
    """``inner`` with ``fault`` injected in the process that is rank ``fault.rank`` of the job.

    ``job_rank``: this process's rank in the job, by default its rank in ``inner`` (the world).
    """

    def __init__(self, inner, fault: Fault, job_rank: int | None = None):
        super().__init__(inner)
        self.fault = fault
        self.job_rank = inner.rank if job_rank is None else job_rank
        self.shot = _Shot()

    def _rewrap(self, inner):
        part = self._rebuild(inner, job_rank=self.job_rank)
        part.shot = self.shot  # one fault per process, whichever communicator it strikes through
        return part

    @property
    def tampered(self) -> str | None:
        """What this process did to the data it sent, once it has (see the module docstring)."""
        return self.shot.tampered

    def where(self, phase: str, step: int | None = None) -> None:
        self.inner.where(phase, step)  # the watchdog notes the moment first
        shot, f = self.shot, self.fault
        if step is not None:
            shot.step = step
        if not shot.fired and phase == "forward" and shot.step == f.step and self.job_rank == f.rank:
            shot.fired = True
            self._fire()

    def _fire(self) -> None:
        f = self.fault
        sys.stderr.write(
            f"{ANNOUNCE} rank {f.rank}, step {f.step}: {f.kind} (MPI_SGD_FAULT={f}) at {time.time():.3f}\n"
        )
        sys.stderr.flush()
        if f.kind == "raise":
            raise RuntimeError(f"fault injected by MPI_SGD_FAULT={f}")
        if f.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if f.kind == "stall":
            while True:
                time.sleep(3600)
        if f.kind == "exit0":
            sys.exit(0)  # SystemExit is no error: no abort hook, exit status 0
        self.shot.armed = f.kind  # nan, shape: the next gradient all-reduce

    def _tamper(self, buf):
        shot = self.shot
        kind, shot.armed = shot.armed, None
        if kind == "nan":
            buf[...] = float("nan")
            shot.tampered = f"MPI_SGD_FAULT={self.fault} replaced its all-reduce input of step {shot.step} by NaN"
        elif kind == "shape":
            buf = buf[:-1]
        return buf

    def allreduce(self, buf, op="sum"):
        if self.shot.armed:
            self.inner.allreduce(self._tamper(buf), op)
            return buf
        return self.inner.allreduce(buf, op)

    def iallreduce(self, buf, op="sum"):
        return self.inner.iallreduce(self._tamper(buf) if self.shot.armed else buf, op)
