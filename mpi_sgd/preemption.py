"""Preemption: on SIGTERM or SIGUSR1, every rank finishes its step, the job saves it, and ends.

Slurm ends a job at its time limit, or when a higher-priority job preempts it, with SIGTERM and,
``KillWait`` seconds later (30 by default), SIGKILL; ``sbatch --signal=USR1@120`` asks for SIGUSR1
two minutes ahead. Without a handler Python dies at once and everything since the last
checkpoint is lost. With :class:`Preemption` the signal only raises a flag; every
:data:`EVERY` steps the ranks agree (one all-reduce of one number, MAX) whether any of them was
signalled, so all stop after the same step even when the signal reaches them at different
moments, or only some of them. Not every step: the steps' own communication stays what the
strategies' formulas say (ZeRO's tests count it), and a few steps are a small part of the
seconds Slurm allows. One process needs no agreement and looks after every step. The trainer
then saves that step (when it has ``--checkpoint``) and raises :class:`Preempted`, which
``sync_sgd.py`` turns into one line and exit status :data:`EXIT_STATUS`.

The bound: :data:`EVERY` steps, plus the save. A second signal while waiting is ignored (the
first is already acted on); SIGKILL cannot be caught, which is why the save must fit in
``KillWait``.
"""

from __future__ import annotations

import signal
import threading

import torch

from .launch import JobError

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_STATUS = 75  # EX_TEMPFAIL (sysexits.h): stopped, not failed; run it again to go on
EVERY = 10  # steps between the ranks' agreements


class Preempted(JobError):
    """Training stopped on a signal after a step every rank finished; ``step`` is that step."""

    def __init__(self, signum: int, step: int, saved: str | None, directory: str | None = None):
        """``saved``: the directory step ``step`` was saved to; None when it was not, ``directory``
        then being the ``--checkpoint`` that was given (its state was not finite, so not saved)."""
        self.signum, self.step, self.saved = signum, step, saved
        name = signal.Signals(signum).name
        if saved:
            text = f"saved step {step} to {saved} on {name}; resume with --resume auto"
        elif directory:
            text = (
                f"stopped after step {step} on {name}; step {step} not saved (its parameters are not finite): "
                f"--resume auto goes on from the last good checkpoint in {directory}"
            )
        else:
            text = f"stopped after step {step} on {name}; nothing saved (no --checkpoint)"
        super().__init__(text)


class Preemption:
    """Within ``with Preemption(comm) as p:``, SIGTERM and SIGUSR1 set a flag instead of ending the
    process; :meth:`agreed` (a collective) returns the signal any rank got, or 0."""

    def __init__(self, comm, device=None):
        self.comm, self.device, self.got, self._old = comm, device, 0, {}

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():  # handlers live in the main thread only
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}

    def _note(self, signum, frame) -> None:
        self.got = self.got or signum

    def agreed(self, step: int) -> int:
        """After step ``step``, on every rank alike: the signal some rank got (the largest number)
        if this is a step they compare at, else 0. A collective on those steps."""
        if self.comm.size == 1:
            return self.got
        if step % EVERY:
            return 0
        flag = torch.tensor([float(self.got)], dtype=torch.float64, device=self.device)  # (NCCL: on the GPU)
        self.comm.allreduce(flag, "max")
        return int(flag.item())
