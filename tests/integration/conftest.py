"""Integration tests launch real jobs with mpiexec and read what they print.

They start their own mpiexec, so they must not run inside an MPI job themselves (as under
``mpirun -n 2 pytest --with-mpi``): there they skip, and ``make test`` runs them on their own.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_sgd.launch import mpiexec_command, usable_cores
from mpi_sgd.launchers import hydra_version, run_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _inside_mpi_job() -> bool:
    return any(int(os.environ.get(v, "1")) > 1 for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))


# The files that take longest, longest first; the rest follow in collection order. make test runs
# the files side by side (JOBS) and hands a process the next file as it runs out of tests, so a
# long file started last is run alone while the other process has nothing left to do. pytest-xdist
# orders them by their count of tests instead (make test turns that off), which put the one-test
# jobs at four ranks and of a minute's training last (docs/contributing/tests.md).
LONGEST_FIRST = (
    "test_docs_commands.py",
    "test_faults.py",
    "test_netns_cluster.py",
    "test_examples.py",
    "test_jobs.py",
    "test_reliability_jobs.py",
    "test_checkpoint_jobs.py",
    "test_four_ranks.py",
    "test_bench_goodput.py",
    "test_first_hour.py",
    "test_sync_sgd_script.py",
    "test_torch_backend.py",
)


def pytest_collection_modifyitems(config, items):
    if _inside_mpi_job():
        skip = pytest.mark.skip(reason="launches its own mpiexec; run outside an MPI job (make test does)")
        for item in items:
            if "integration" in item.nodeid:
                item.add_marker(skip)
    order = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def rank(item) -> int:
        return order.get(Path(str(item.fspath)).name, len(order)) if "integration" in item.nodeid else -1

    items.sort(key=rank)


def oversubscribed(n: int) -> dict[str, str]:
    """What a job of ``n`` ranks needs when they outnumber this machine's cores: MPICH's waiting
    ranks then sleep instead of polling (``MPIR_CVAR_ENABLE_HEAVY_YIELD``), or the ranks with work
    to do wait for scheduler slices behind polling ones and a test at four ranks on two cores
    takes seconds to minutes by chance (see docs/contributing/tests.md). Other MPIs ignore the
    variable (Open MPI yields by itself when oversubscribed); a value already set is kept.
    Intel MPI pins each rank to one core unless told not to (``I_MPI_PIN``): with more ranks than
    cores two ranks share a core, and every thread of a rank (its watchdog's, its progress
    threads) is held to that one core."""
    if n <= usable_cores():
        return {}
    wanted = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "I_MPI_PIN": "0"}
    return {name: value for name, value in wanted.items() if name not in os.environ}


def polls_when_oversubscribed(n: int) -> str | None:
    """Why a job of ``n`` ranks cannot be given a time limit here, or None: they outnumber the
    cores and the MPI is an MPICH without ``MPIR_CVAR_ENABLE_HEAVY_YIELD`` (Debian 12's 4.0.2 has
    none, the 5.0.2 wheel has it; versions before 5 are taken to lack it, 4.1-4.3 unchecked), so
    its waiting ranks poll and the ranks with work wait for the scheduler. On two cores the same
    file of tests at four ranks took 71 to over 200 s from one run to the next under it."""
    if n <= usable_cores():
        return None
    version = hydra_version(mpiexec_command(1, "-c", "pass")[0][0])
    if version and version[0] < 5:
        return (
            f"{n} ranks on {usable_cores()} cores under MPICH {version[0]}.{version[1]}, which "
            "polls while it waits (no MPIR_CVAR_ENABLE_HEAVY_YIELD): minutes by chance, not a test"
        )
    return None


def run_mpi(n: int, *args: str, timeout: float = 120, env: dict | None = None, check: bool = True, then: tuple = ()):
    """Run ``mpiexec -n n python args...``; return the CompletedProcess (stdout and stderr as text).
    ``then``: the arguments of a second program of the same job, one rank (``... : -n 1 python then...``)."""
    cmd, base_env = mpiexec_command(n, *args)
    cmd += [":", "-n", "1", sys.executable, *then] if then else []
    n += 1 if then else 0
    full_env = {**base_env, **oversubscribed(n), "MPIEXEC_TIMEOUT": str(int(timeout)), **(env or {})}
    proc = run_job(cmd, shlex.join(cmd), cwd=ROOT, timeout=timeout + 30, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{shlex.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def own_lines(stderr: str) -> list[str]:
    """The job's own lines of ``stderr``, less its launcher's report of a rank's non-zero exit:
    Open MPI's launcher frames one between lines of dashes; hydra says nothing for a plain status."""
    lines, framed = [], False
    for line in stderr.splitlines():
        if line.strip() and set(line.strip()) == {"-"}:
            framed = not framed
        elif line.strip() and not framed:
            lines.append(line)
    return lines


def run_cli(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    """``python -m mpi_sgd.cli args`` as one process that launches its own jobs (each ended by the
    launcher after MPIEXEC_TIMEOUT, before this call's own timeout); stdout and stderr as text."""
    cmd = [sys.executable, "-m", "mpi_sgd.cli", *args]
    # One torch thread, as every job here: beside the other file's jobs a process of two threads
    # (its default on two cores) spins at each parallel op's barrier while its second thread waits
    # for a core (docs/contributing/tests.md has what it cost bench goodput's test).
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(int(timeout) - 50), "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def widest_line(stdout: str) -> int:
    """Columns of the widest line a benchmark printed, its 'wrote <paths>' lines aside (the paths are
    the user's): the project keeps terminal output within 120."""
    return max(len(line) for line in stdout.splitlines() if not line.startswith("wrote "))


def table_header(stdout: str) -> list[str]:
    """The cells of the first markdown table's header row in ``stdout``."""
    header = next(line for line in stdout.splitlines() if line.startswith("|"))
    return [c.strip() for c in header.strip("|").split("|")]


# A test that runs whole files of tests/mpi at four ranks (run_mpi_tests) gets longer than the
# suite's 120 s: those take 10-25 s with the MPICH wheel but over 100 s with an MPICH whose UCX
# transport polls while it waits (Debian's), four ranks on two cores. The job's own limit
# (MPIEXEC_TIMEOUT, 240 s) comes first, so a hang still ends with every rank's report.
WHOLE_FILES = pytest.mark.timeout(300)


def run_mpi_tests(
    n: int, *files: str, select: str | None = None, timeout: float = 240
) -> tuple[list[tuple[int, int]], str]:
    """``files`` of tests/mpi under ``mpiexec -n n python -m mpi4py -m pytest --with-mpi -x`` (one
    torch thread per rank), only those ``-k select`` picks; the numbers of tests each rank passed
    and skipped (one pair per rank that reported) and the job's output, to show when an assertion
    fails.
    Mark the test :data:`WHOLE_FILES`."""
    paths = [str(ROOT / "tests" / "mpi" / f) for f in files]
    # no colours: Open MPI's launcher gives the ranks a terminal, and the tally is read from the text
    args = ["-m", "mpi4py", "-m", "pytest", "--with-mpi", "-x", "-q", "-p", "no:cacheprovider", "--color=no"]
    args += ["-k", select] if select else []
    out = run_mpi(n, *args, *paths, env={"OMP_NUM_THREADS": "1"}, timeout=timeout)
    tallies = re.findall(r"(\d+) passed(?:, (\d+) skipped)?", out.stdout)
    return [(int(passed), int(skipped or 0)) for passed, skipped in tallies], out.stdout[-2000:]
