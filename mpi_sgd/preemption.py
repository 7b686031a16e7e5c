"""Preemption: SIGTERM or SIGUSR1 ends training at a step boundary, with a checkpoint of that step.

A batch system ends a job with SIGTERM (Slurm: at the time limit, on ``scancel`` and on preemption;
SIGKILL follows ``KillWait`` seconds later, 30 by default) and can warn ahead of the limit with
another signal (``sbatch --signal=B:USR1@120``; see ``hostfiles/slurm.sbatch``). MPICH's and Open
MPI's launchers pass both on to every rank. The default reaction, death, loses everything since
the last checkpoint; here a rank that receives either only notes it, and after every step the
ranks agree whether any of them did (one all-reduce of one integer, ``max``: a signal that reached
one rank alone counts). Then every rank has finished the same step, the job checkpoints it (a
save as any other, within ``--save-timeout``), the root prints one line, and every rank exits with
:data:`EXIT_PREEMPTED`, which the batch script takes as "requeue me".

Bound: the time from the signal to the saved checkpoint is at most one step (the one in progress)
plus one save. The agreement costs one latency-bound all-reduce per step, and only with
``--checkpoint`` (without one, nothing could be saved and the signals keep their default action).
Handlers can be installed from the main thread only; a trainer run from another thread keeps the
default action too.
"""

from __future__ import annotations

import signal
import threading

import torch

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL in sysexits.h, "try again later": hostfiles/slurm.sbatch requeues on it


class Preempted(Exception):
    """Training stopped on a signal after checkpointing step ``step`` into ``directory``."""

    status = EXIT_PREEMPTED

    def __init__(self, signum: int, step: int, directory: str):
        self.signum, self.step, self.directory = signum, step, directory
        name = signal.Signals(signum).name
        super().__init__(f"saved step {step} to {directory} on {name}; resume with --resume auto")


class Preemption:
    """Notes SIGTERM/SIGUSR1 on this rank; :meth:`due` tells every rank alike whether any got one."""

    def __init__(self, comm, enabled: bool, device="cpu"):
        self.comm, self.received = comm, 0
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)  # on the data's device: NCCL's
        self._before = {s: signal.signal(s, self._note) for s in SIGNALS} if self.enabled else {}

    def _note(self, signum, frame) -> None:
        self.received = self.received or signum  # only noted: the step in progress finishes first

    def due(self) -> int:
        """The signal any rank received (0: none): a collective, every rank at the same step."""
        if not self.enabled:
            return 0
        self.flag.fill_(self.received)
        self.comm.allreduce(self.flag, "max")
        return int(self.flag.item())

    def close(self) -> None:
        """Give the signals their earlier handlers back."""
        for s, handler in self._before.items():
            signal.signal(s, handler)
        self._before = {}
