"""Under ``mpirun -n 2 pytest --with-mpi`` (the README's command: no ``python -m mpi4py``, no ``-x``),
a test that fails on one rank would leave the other ranks waiting in its collectives, or pair
them with the next test's. So in a job of more than one rank a failure ends the job at once,
as ``python -m mpi4py`` does, after printing the report: a failing rank never becomes a hang."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from mpi_sgd.launch import placement


def pytest_runtest_logreport(report):
    if report.failed and placement().size > 1:
        rank = placement().rank
        sys.stderr.write(f"\nrank {rank}: {report.nodeid} failed ({report.when}); aborting the job\n")
        sys.stderr.write(report.longreprtext + "\n")
        sys.stderr.flush()
        time.sleep(0.5)  # let the launcher forward the report before the abort tears its pipes down
        _drop_claims()
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
            _drop_claims()
            abort(self, code)

    MPIComm.abort = telling_abort


@dataclass
class _Claims:
    """The unit tests the ranks of one host share: ``index`` numbers them in collection order (the
    same on every rank), a file named by the number in ``folder`` claims one."""

    folder: Path
    index: dict[str, int]
    ran: int = 0
    done: bool = False


_claims: _Claims | None = None  # set where the ranks share one host


def _drop_claims() -> None:
    """Remove the claims' folder: at the end, or before an abort, by whichever rank aborts."""
    if _claims is not None:
        shutil.rmtree(_claims.folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """In a job of several ranks (``mpirun -n 2 pytest --with-mpi``), the one-process tests of
    tests/unit are shared out among the ranks, each run by one of them, where pytest-mpi would have
    every rank run all of them side by side: they do not communicate, so R copies tested nothing
    more and cost R times the CPU (about half of that command's time on a 2-core machine). Every
    other test (tests/mpi: collectives, marked or not) runs on every rank, as it must.

    Ranks that share one host take the unit tests as they go: each rank claims the next test not
    yet taken (a file created in a folder they share, which only one creation can win), so a rank
    that drew the slow ones (those that start processes) does not end long after the others
    (docs/contributing/tests.md). Ranks on several hosts share no folder, and are dealt in turn."""
    global _claims
    where = placement()
    if where.size <= 1:
        return
    unit = Path(__file__).parent / "unit"
    units = [item for item in items if unit in Path(str(item.fspath)).parents]
    if not units:
        return
    from mpi4py import MPI

    if where.local_size == where.size:
        folder = MPI.COMM_WORLD.bcast(tempfile.mkdtemp(prefix="mpi-sgd-unit-claims-") if where.rank == 0 else None)
        _claims = _Claims(Path(folder), {item.nodeid: i for i, item in enumerate(units)})
        return
    elsewhere = [item for i, item in enumerate(units) if i % where.size != where.rank]
    config.hook.pytest_deselected(items=elsewhere)
    gone = set(elsewhere)
    items[:] = [item for item in items if item not in gone]


def _claim(folder: Path, index: int) -> bool:
    """Whether this rank wins unit test ``index``. A folder already removed means the job is
    ending: the root removes it once every test has been claimed, a rank that aborts before it aborts."""
    try:
        os.close(os.open(folder / str(index), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except (FileExistsError, FileNotFoundError):
        return False


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """pytest's own loop (_pytest.main), but for unit tests claimed as it goes. The next test is
    claimed before this one runs: pytest tears a test's fixtures down knowing which test comes next."""
    claims = _claims
    if claims is None or session.config.option.collectonly or session.testsfailed:
        return None  # pytest's own loop, which also stops at collection errors

    def mine():
        for item in session.items:
            i = claims.index.get(item.nodeid)
            if i is None or _claim(claims.folder, i):
                claims.ran += i is not None
                yield item

    todo = mine()
    item = next(todo, None)
    while item is not None:
        nextitem = next(todo, None)
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        item = nextitem
    claims.done = True
    return True


def pytest_sessionfinish(session):
    """Every unit test ran exactly once over the ranks, or the run fails saying so."""
    claims = _claims
    if claims is None:
        return
    if claims.done:  # on every rank, or on none: a rank that stopped early has aborted the job
        from mpi4py import MPI

        total = MPI.COMM_WORLD.allreduce(claims.ran)
        if total != len(claims.index):
            sys.stderr.write(f"\nrank {placement().rank}: the ranks ran {total} unit tests of {len(claims.index)}\n")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if placement().rank == 0:
        _drop_claims()
