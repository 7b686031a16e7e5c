"""The shared-memory all-reduce in whole jobs: with a rank killed, and its benchmark (its MPI tests at
four ranks are in test_four_ranks.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import run_mpi, widest_line

ENV = {"OMP_NUM_THREADS": "1"}

KILLED = """
import os, signal, threading, time
from mpi_sgd.comm import init

comm = init()
buf = comm.alloc_shared(1 << 22)  # 16 MiB: each all-reduce takes a while, so the kill lands inside one
with open("/proc/self/maps") as f:
    paths = sorted({line.split(None, 5)[-1].strip().removesuffix(" (deleted)") for line in f if "/dev/shm/" in line})
print(f"rank {comm.rank} pid {os.getpid()} maps {' '.join(paths)}", flush=True)
comm.barrier()
if comm.rank == 1:
    def die():
        print(f"killing rank 1 at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Timer(0.5, die).start()
while True:
    comm.allreduce(buf)
"""


# For the "survivors" case: each rank runs under this wrapper, which passes the rank's end on as an
# exit status (137 for SIGKILL) and ignores hydra's SIGUSR1 notice that a rank of the job ended.
# Hydra's proxy SIGKILLs the other ranks of a host as soon as it reaps one that died by a signal,
# -disable-auto-cleanup or not; through the wrapper it sees exits only and leaves the survivors
# running, as a launcher without clean-up does. The rank itself is still SIGKILLed mid-all-reduce.
AS_EXIT = """
import signal, subprocess, sys
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
rc = subprocess.call([sys.executable, *sys.argv[1:]], close_fds=False)  # the launcher's PMI socket too
sys.exit(128 - rc if rc < 0 else rc)
"""


def _launcher() -> str:
    return os.environ.get("MPI_SGD_MPIEXEC") or shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or ""


def _hydra() -> bool:
    try:
        out = subprocess.run([*_launcher().split(), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "HYDRA" in out.stdout


@pytest.mark.parametrize("cleanup", ["launcher", "survivors"])
def test_a_killed_rank_ends_the_job_named_and_leaves_no_shared_memory(tmp_path, monkeypatch, cleanup):
    """Rank 1 is SIGKILLed inside a loop of shared all-reduces.

    ``survivors``: a launcher that leaves the other ranks running (``srun`` without
    ``--kill-on-bad-exit``): hydra with ``-disable-auto-cleanup``, each rank under :data:`AS_EXIT`.
    Nothing but the survivors' bounded wait ends the job, and their error must name rank 1.
    ``launcher``: hydra as it is, which ends the job itself within milliseconds, SIGKILLing the
    survivors; whether their check names rank 1 first is a race (hydra's own report names the pid
    of some process of the job, not necessarily the dead one), so here only a wrong name fails.
    Either way the job ends within 10 s and no /dev/shm file any rank had mapped still exists.
    """
    if not _hydra():
        pytest.skip("needs MPICH's hydra launcher (the disable-auto-cleanup flag and its messages)")
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    args = [str(script)]
    if cleanup == "survivors":
        monkeypatch.setenv("MPI_SGD_MPIEXEC", f"{_launcher()} -disable-auto-cleanup")
        args = ["-c", AS_EXIT, *args]
    proc = run_mpi(3, *args, env=ENV, check=False, timeout=60)
    ended = time.time()
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    killed_at = re.search(r"killing rank 1 at ([\d.]+)", text)
    assert killed_at, text
    assert ended - float(killed_at.group(1)) < 10, text
    pid = re.search(r"rank 1 pid (\d+)", text).group(1)
    named = f"rank(s) 1 (pid {pid}) exited" in text
    assert named or (cleanup == "launcher" and "exited while this rank waited" not in text), text
    mapped = {p for line in re.findall(r"^rank \d+ pid \d+ maps (.*)$", text, re.M) for p in line.split()}
    # MPICH's own segment was among them: mpich_shm_* from MPICH 5, mpich_shar_tmp* from 4.0
    assert mapped and any("mpich_shm_" in p or "mpich_shar_" in p for p in mapped), mapped
    left = sorted(p for p in mapped if os.path.exists(p))
    assert not left, f"left in /dev/shm: {left}"


def test_bench_shm_prints_the_comparison_and_the_targets(tmp_path):
    sweep = ["--min-bytes", "4KiB", "--max-bytes", "128KiB", "--pool", "4MiB", "--rounds", "2", "--iterations", "20"]
    out = run_mpi(2, "-m", "mpi_sgd.cli", "bench", "shm", *sweep, "--out-dir", str(tmp_path), env=ENV)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in out.stdout.splitlines() if line[:1] == "|"]
    headers = [row for row in cells if row[0] == "size"]
    assert headers == [
        ["size", "shared", "raw", "seam", "gloo", "memcpy"],
        ["size", "raw/shared", "seam/shared", "gloo/shared", "shared/memcpy", "busbw GB/s (shared)", "#wrong"],
    ]
    assert re.search(
        r"target >= 1.5x MPI Allreduce from 128 KiB: (met|not met here|inconclusive here)\s+\(lowest",
        out.stdout,
    )
    assert re.search(r"target >= 1x MPI Allreduce below 64 KiB: (met|not met here|inconclusive here)", out.stdout)
    assert widest_line(out.stdout) <= 120
    rows = json.loads((tmp_path / "shm-n2.json").read_text())["rows"]
    assert [r["bytes"] for r in rows] == [4096 << k for k in range(6)]
    assert all(r[i] > 0 for r in rows for i in ("shared", "raw", "seam", "gloo", "memcpy"))
    # every all-reduce summed known values exactly at every size, the shared path (from 16 KiB) too
    assert all(
        r[f"{i}_wrong"] == 0 and r[f"{i}_busbw_GBps"] > 0 for r in rows for i in ("shared", "raw", "seam", "gloo")
    )
