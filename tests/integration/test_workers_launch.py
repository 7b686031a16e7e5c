"""``mpi-sgd bench workers`` as one process: it launches one mpiexec per worker count and merges."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_two_worker_counts_at_one_megabyte(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "mpi_sgd.cli",
        "bench",
        "workers",
        "--workers",
        "2,3",
        "--max-bytes",
        "1MB",
        "--backends",
        "mpi4py,gloo",
        "--warmup",
        "1",
        "--iterations",
        "2",
        "--out-dir",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "MPIEXEC_TIMEOUT": "120"})
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads((tmp_path / "workers-allreduce.json").read_text())["rows"]
    assert sorted((r["backend"], r["workers"], r["bytes"]) for r in rows) == [
        ("gloo", 2, 10**6),
        ("gloo", 3, 10**6),
        ("mpi4py", 2, 10**6),
        ("mpi4py", 3, 10**6),
    ]
    assert all(0 < r["min_s"] <= r["avg_s"] <= r["max_s"] for r in rows)
    assert (tmp_path / "workers-allreduce.png").exists()
