"""Under ``mpirun -n 2 pytest --with-mpi`` (the README's command: no ``python -m mpi4py``, no ``-x``),
a test that fails on one rank would leave the other ranks waiting in its collectives, or pair
them with the next test's. So in a job of more than one rank a failure ends the job at once,
as ``python -m mpi4py`` does, after printing the report: a failing rank never becomes a hang."""

from __future__ import annotations

import sys
import time
from pathlib import Path

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


# A job can also be aborted from a thread while a test runs: the stall watchdog's monitor, or a
# save's deadline. pytest holds that test's output (its file descriptors too), so the report the
# thread wrote, and MPI's own abort line, would vanish with the process: a job that ends with a
# status and no word. Every abort therefore first hands pytest's capture back and prints it.
_running: list[str] = []


def pytest_runtest_logstart(nodeid, location):
    _running[:] = [nodeid]


def pytest_configure(config):
    capman = config.pluginmanager.getplugin("capturemanager")
    from mpi_sgd.comm.backends.mpi import MPIComm

    abort = MPIComm.abort

    def telling_abort(self, code=1):
        try:
            out, err = "", ""
            if capman is not None:
                capman.suspend_global_capture(in_=True)
                out, err = capman.read_global_capture()
            test = _running[0] if _running else "(between tests)"
            sys.stderr.write(
                f"\nrank {placement().rank}: aborting the job (status {code}) during {test}; "
                f"what it printed so far:\n{out}{err}\n"
            )
            sys.stderr.flush()
        finally:
            abort(self, code)

    MPIComm.abort = telling_abort


def pytest_collection_modifyitems(config, items):
    """In a job of several ranks (``mpirun -n 2 pytest --with-mpi``), the one-process tests of
    tests/unit are dealt out among the ranks, each run by one of them, where pytest-mpi would have
    every rank run all of them side by side: they do not communicate, so R copies tested nothing
    more and cost R times the CPU (about half of that command's time on a 2-core machine). Every
    other test (tests/mpi: collectives, marked or not) runs on every rank, as it must. The deal
    follows collection order, which is the same on every rank."""
    where = placement()
    if where.size <= 1:
        return
    unit = Path(__file__).parent / "unit"
    keep, elsewhere, dealt = [], [], 0
    for item in items:
        if unit in Path(str(item.fspath)).parents:
            (keep if dealt % where.size == where.rank else elsewhere).append(item)
            dealt += 1
        else:
            keep.append(item)
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = keep
