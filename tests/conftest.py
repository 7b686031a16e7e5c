"""Under ``mpirun -n 2 pytest --with-mpi`` (the README's command: no ``python -m mpi4py``, no ``-x``),
a test that fails on one rank would leave the other ranks waiting in its collectives, or pair
them with the next test's. So in a job of more than one rank a failure ends the job at once,
as ``python -m mpi4py`` does, after printing the report: a failing rank never becomes a hang."""

from __future__ import annotations

import sys
import time

from mpi_sgd.launch import placement


def pytest_runtest_logreport(report):
    if report.failed and placement().size > 1:
        rank = placement().rank
        sys.stderr.write(f"\nrank {rank}: {report.nodeid} failed ({report.when}); aborting the job\n")
        sys.stderr.write(report.longreprtext + "\n")
        sys.stderr.flush()
        time.sleep(0.5)  # let the launcher forward the report before the abort tears its pipes down
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
