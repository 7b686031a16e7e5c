"""Preemption and a second job, as real two- and three-rank jobs: SIGTERM or SIGUSR1 to the launcher
saves the step every rank finished and exits 75; ``latest`` then names the newest checkpoint that
verifies, which is the one ``--resume auto`` takes; a second job in the same directory is refused
while the first runs, and leaves its checkpoints alone."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from mpi_sgd.checkpoint import store
from mpi_sgd.launch import mpiexec_command
from mpi_sgd.preemption import EXIT_PREEMPTED

from .conftest import EXAMPLES, ROOT, run_mpi

TRAIN = ("--epochs", "1000", "--no-progress", "--val-fraction", "0", "--checkpoint-every", "5")


def _start(n: int, ck: str, *extra: str) -> subprocess.Popen:
    cmd, env = mpiexec_command(n, str(EXAMPLES / "sync_sgd.py"), *TRAIN, "--checkpoint", ck, *extra)
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_checkpoint(job: subprocess.Popen, ck: str) -> None:
    deadline = time.monotonic() + 120
    while not store.checkpoints(ck) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.poll() is None, job.communicate()[0]


def _newest_verified(ck: str) -> str:
    found = store.newest_valid(ck, print)
    assert found is not None
    return found[0]


@pytest.mark.parametrize(("n", "sig"), [(2, signal.SIGTERM), (3, signal.SIGUSR1)])
def test_a_signal_saves_the_step_and_resume_auto_continues_from_it(tmp_path, n, sig):
    ck = str(tmp_path / "ck")
    job = _start(n, ck)
    _wait_for_checkpoint(job, ck)
    job.send_signal(sig)
    out, _ = job.communicate(timeout=120)
    assert job.returncode == EXIT_PREEMPTED, out
    m = re.search(rf"^saved step (\d+) to {re.escape(ck)} on {sig.name}; resume with --resume auto$", out, re.M)
    assert m, out
    step = int(m.group(1))
    assert store.latest(ck) == _newest_verified(ck) == os.path.join(ck, store.step_name(step))
    resumed = run_mpi(
        n,
        str(EXAMPLES / "sync_sgd.py"),
        *TRAIN[:-2],
        "--checkpoint",
        ck,
        "--resume",
        "auto",
        "--max-steps",
        str(step + 3),
        timeout=120,
    )
    assert f"resuming from {os.path.join(ck, store.step_name(step))} at step {step}" in resumed.stdout
    assert store.latest(ck) == _newest_verified(ck) == os.path.join(ck, store.step_name(step + 3))


def test_a_second_job_is_refused_and_the_first_keeps_its_checkpoints(tmp_path):
    ck = str(tmp_path / "ck")
    first = _start(2, ck)
    _wait_for_checkpoint(first, ck)
    second = run_mpi(
        2, str(EXAMPLES / "sync_sgd.py"), *TRAIN, "--checkpoint", ck, "--resume", "auto", timeout=120, check=False
    )
    assert second.returncode == 2
    lines = [x for x in (second.stdout + second.stderr).splitlines() if "is in use by another job" in x]
    assert lines and re.search(r"\(host \S+, pid \d+, started ", lines[0]), lines
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=120)
    assert first.returncode == EXIT_PREEMPTED, out
    step = int(re.search(r"^saved step (\d+)", out, re.M).group(1))
    assert store.latest(ck) == _newest_verified(ck) == os.path.join(ck, store.step_name(step))
