"""One job per checkpoint directory: a second job is refused in one line naming the first, and the
lock goes with the process however it ends (no stale lock after a kill)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from mpi_sgd.checkpoint import CheckpointError, hold, lock
from mpi_sgd.comm.backends.local import LocalComm

HOLD = (  # another job's root: takes the lock, says so, and keeps it
    "import sys, time; from mpi_sgd.checkpoint import lock; "
    "assert lock.acquire(sys.argv[1]) is None; print('held', flush=True); time.sleep(60)"
)


def holder(directory) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_job_is_refused_naming_the_first(tmp_path):
    first = holder(tmp_path / "ck")
    try:
        with pytest.raises(CheckpointError) as e:
            hold(str(tmp_path / "ck"), LocalComm())
        text = str(e.value)
        assert "\n" not in text and "is in use by another job" in text and f"pid {first.pid}" in text
    finally:
        first.kill()
        first.wait()


def test_a_killed_job_leaves_no_stale_lock(tmp_path):
    first = holder(tmp_path / "ck")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert lock.acquire(str(tmp_path / "ck")) is None  # the kernel released it with the process
    assert f"pid {os.getpid()}" in (tmp_path / "ck" / ".lock").read_text()
    assert lock.acquire(str(tmp_path / "ck")) is None  # this process again: already its own


def test_the_lock_file_is_not_a_checkpoint(tmp_path):
    from mpi_sgd.checkpoint import checkpoints

    lock.acquire(str(tmp_path / "d"))
    assert checkpoints(str(tmp_path / "d")) == []
