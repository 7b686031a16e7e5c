"""Integration tests launch real jobs with mpiexec and read what they print.

They start their own mpiexec, so they must not run inside an MPI job themselves (as under
``mpirun -n 2 pytest --with-mpi``): there they skip, and ``make test`` runs them on their own.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _inside_mpi_job() -> bool:
    return any(int(os.environ.get(v, "1")) > 1 for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))


def pytest_collection_modifyitems(config, items):
    if _inside_mpi_job():
        skip = pytest.mark.skip(reason="launches its own mpiexec; run outside an MPI job (make test does)")
        for item in items:
            if "integration" in item.nodeid:
                item.add_marker(skip)


def mpiexec_command() -> list[str]:
    """MPI_SGD_MPIEXEC (the Makefile sets it), else the mpiexec beside this Python, else PATH's."""
    if os.environ.get("MPI_SGD_MPIEXEC"):
        return shlex.split(os.environ["MPI_SGD_MPIEXEC"])
    beside = Path(sys.executable).parent / "mpiexec"
    return [str(beside) if beside.exists() else "mpiexec"]


def run_mpi(n: int, *args: str, timeout: float = 120, env: dict | None = None, check: bool = True):
    """Run ``mpiexec -n n python args...``; return the CompletedProcess (stdout and stderr as text)."""
    cmd = [*mpiexec_command(), "-n", str(n), sys.executable, *args]
    full_env = {**os.environ, "MPIEXEC_TIMEOUT": str(int(timeout)), **(env or {})}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 30, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{shlex.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc
