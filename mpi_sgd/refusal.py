"""Ending the whole job from a rank that refused its input before MPI started.

Every rank checks its flags, files and environment before MPI starts, so that bad input is one
line and exit status 2 with no rank waiting for another. Usually every rank refuses alike. But
a check can fail on some ranks only: a data file missing on one host, a variable set on one, a
rank of another program (``mpiexec -n 1 a : -n 1 b``). The ranks that passed then wait in MPI's
start-up for the one that left, and with MPICH's launcher (Hydra) they wait for ever: a process
that exits without starting MPI is not a failure to it (pmodels/mpich#6124, closed as won't fix).

So a refusing rank also tells the launcher to end the job, through the launcher's own protocol,
which needs no MPI: Hydra (MPICH, Intel MPI) hands each process a PMI-1 socket (``PMI_FD``), on
which ``cmd=abort`` ends every rank with the given status, as ``MPI_Abort`` does. Open MPI's
launcher already ends a job at the first rank to exit non-zero; Slurm's ``srun`` does with
``--kill-on-bad-exit``. Elsewhere the refusing rank can only exit.
"""

from __future__ import annotations

import os
import select
import sys

_PMI_INIT = b"cmd=init pmi_version=1 pmi_subversion=1\n"


def mpi_started() -> bool:
    """Whether this process has started MPI: a refusal then comes from code every rank runs alike
    (a script's own checks after ``init``), and MPI owns the launcher's socket."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized()


def end_job(status: int) -> bool:
    """Ask the launcher to end every rank of this job with ``status``; False where it offers no way
    to (not under Hydra), or MPI has started here. Returns once asked; the launcher then kills
    this process too."""
    fd = os.environ.get("PMI_FD", "")
    if not fd.isdigit() or mpi_started():
        return False
    try:
        os.write(int(fd), _PMI_INIT)
        # a bounded wait: another PMI server on this variable (Slurm's PMI-2 speaks another wire
        # format) may not answer a PMI-1 line at all, and a refusing rank must not hang instead
        if not select.select([int(fd)], [], [], 2.0)[0]:
            return False
        if not os.read(int(fd), 1024).startswith(b"cmd=response_to_init"):
            return False
        os.write(int(fd), f"cmd=abort exitcode={status}\n".encode())
    except OSError:  # not a PMI socket after all, or the launcher already gone
        return False
    return True
