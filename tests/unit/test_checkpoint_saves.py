"""Saves that fail as storage fails: a full disk, a slow or hung write, a directory that cannot be
written, an empty or truncated file. Each ends in one line naming the path, and the previous
checkpoint still loads. The jobs themselves: the fault matrix (tests/integration/test_faults.py)."""

from __future__ import annotations

import errno
import os
import time

import pytest

from mpi_sgd.checkpoint import CheckpointError, deadline, lock, read_state, serialize, storagefaults, store
from mpi_sgd.checkpoint.payload import deserialize, read
from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.comm.wrappers.watchdog import Watchdog
from mpi_sgd.config import TrainConfig


def _saved(d, step: int) -> str:
    return store.save(serialize({"step": step}), {"step": step}, d, step)


def test_a_full_disk_leaves_nothing_behind_and_the_previous_checkpoint_loads(tmp_path, monkeypatch):
    d = str(tmp_path / "ck")
    _saved(d, 1)
    monkeypatch.setenv(storagefaults.SAVE_FAULT, "full")  # writes half the state, then ENOSPC
    with pytest.raises(CheckpointError) as e:
        _saved(d, 2)
    line = str(e.value)
    assert "\n" not in line and "saving step 2 to" in line and d in line
    assert "no space left on the device; the checkpoint needs" in line and "partial files were removed" in line
    assert sorted(os.listdir(d)) == [store.LATEST, store.step_name(1)]  # no .tmp-* keeps the disk full
    assert read_state(d) == {"step": 1}


def test_any_write_error_is_one_line_and_cleaned_up(tmp_path, monkeypatch):
    d = str(tmp_path / "ck")
    _saved(d, 1)

    def failing(path, blob):
        with open(path, "wb") as f:
            f.write(blob[: len(blob) // 2])
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    monkeypatch.setattr(store, "_write", failing)
    with pytest.raises(CheckpointError, match=r"saving step 2 to .* failed: Input/output error"):
        _saved(d, 2)
    assert sorted(os.listdir(d)) == [store.LATEST, store.step_name(1)]


@pytest.mark.parametrize("bad", ["slow", "slow:-1", "slow:x", "slow:inf", "full:3", "fast", "slow-read", "read:1"])
def test_the_save_fault_hook_is_refused_in_one_line_when_malformed(monkeypatch, bad):
    monkeypatch.setenv(storagefaults.SAVE_FAULT, bad)
    with pytest.raises(ValueError, match=r"MPI_SGD_SAVE_FAULT=.*expected slow:SECONDS"):
        storagefaults.save_fault()
    with pytest.raises(ValueError, match=r"MPI_SGD_SAVE_FAULT=.*expected slow:SECONDS"):
        TrainConfig()  # at start, with or without --checkpoint: never silently unused
    monkeypatch.setenv(storagefaults.SAVE_FAULT, "slow:0.5")
    assert storagefaults.save_fault() == ("slow", 0.5)
    monkeypatch.setenv(storagefaults.SAVE_FAULT, "slow-read:2")
    assert storagefaults.save_fault() == ("slow-read", 2.0)


def test_a_slow_read_delays_reads_only(monkeypatch, tmp_path):
    saved = store.save(b"state", {"step": 1}, str(tmp_path), 1)
    monkeypatch.setenv(storagefaults.SAVE_FAULT, "slow-read:30")
    slept = []
    monkeypatch.setattr(store.time, "sleep", slept.append)
    store.save(b"state", {"step": 2}, str(tmp_path), 2)  # neither delayed nor refused
    assert slept == []
    assert read(saved)[1] == b"state" and slept == [30.0]


def test_a_directory_that_cannot_be_written_is_refused_at_start(tmp_path):
    assert "cannot be written" in lock.acquire("/proc/no-such-checkpoints")
    plain = tmp_path / "file"
    plain.write_text("x")
    assert "cannot be written" in lock.acquire(str(plain / "ck"))
    assert lock.acquire(str(tmp_path / "fine")) is None
    assert os.listdir(tmp_path / "fine") == [lock.LOCK]  # the probe file is gone


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated"])
def test_an_empty_or_truncated_pt_file_is_one_line(tmp_path, content):
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    where, blob, _ = read(str(path))
    with pytest.raises(CheckpointError, match="not a torch checkpoint, or a truncated one") as e:
        deserialize(blob, where)
    assert "\n" not in str(e.value)


class _Root(LocalComm):
    """The one-rank communicator, its abort noted instead of ending the test."""

    aborted = None

    def abort(self, code=1):
        self.aborted = code


def test_a_save_runs_within_its_deadline_and_its_failure_reaches_the_caller():
    comm = _Root()
    assert deadline.run(comm, lambda: "done", "saving step 1 to 'x'", timeout=5) == "done"

    def full():
        raise CheckpointError("saving step 2 to 'x' failed: no space left on the device")

    with pytest.raises(CheckpointError, match="no space left"):
        deadline.run(comm, full, "saving step 2 to 'x'", timeout=5)
    assert comm.aborted is None


def test_a_hung_save_is_named_and_ends_the_job(capsys):
    comm = _Root()
    deadline.run(comm, lambda: time.sleep(3), "saving step 7 to '/ck'", timeout=0.2)
    assert comm.aborted == deadline.HUNG_STATUS
    err = capsys.readouterr().err
    assert "checkpoint save hung: saving step 7 to '/ck' has not finished" in err and "--save-timeout 0.2" in err


def test_the_watchdogs_are_patient_while_a_save_runs_and_only_then():
    from mpi_sgd.comm import init

    wd = Watchdog(init("local"), timeout=1.0)
    seen = []
    deadline.run(wd, lambda: seen.append(wd.patience), "saving", timeout=4)
    assert seen == [4 + deadline.MARGIN] and wd.patience == 0.0
