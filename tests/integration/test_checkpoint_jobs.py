"""Two real jobs in one ``--checkpoint`` directory: the second is refused in one line naming the
first, while the first trains on; afterwards ``latest`` names the newest checkpoint that verifies
(the one ``--resume auto`` takes), written by the first job alone. The first job trains until it is
told to stop (the signal a scheduler sends, which saves the step it is at), so it is still running
however long the launcher takes to start the second one under load, and the test waits for nothing
longer than the two jobs' own start and one save."""

from __future__ import annotations

import os
import re
import subprocess
import time

from mpi_sgd.checkpoint import read_state, store
from mpi_sgd.launch import mpiexec_command
from mpi_sgd.launchers import statuses_after_signal, stop_signal

from .conftest import EXAMPLES, ROOT, own_lines, run_mpi

# Epochs enough for minutes of training: the first job ends when the test signals it.
TRAIN = ("--epochs", "1000", "--no-progress", "--val-fraction", "0", "--batch-size", "8")


def test_a_second_job_is_refused_and_the_first_keeps_its_checkpoints(tmp_path):
    ck = str(tmp_path / "ck")
    cmd, env = mpiexec_command(2, str(EXAMPLES / "sync_sgd.py"), *TRAIN, "--checkpoint", ck)
    env = {**env, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not store.checkpoints(ck) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.checkpoints(ck), "the first job wrote no checkpoint"
        second = run_mpi(2, str(EXAMPLES / "sync_sgd.py"), *TRAIN, "--checkpoint", ck, "--resume", "auto", check=False)
        assert first.poll() is None, "the first job ended before the second was refused: the test proves nothing"
        signal = stop_signal(cmd[0])
        first.send_signal(signal)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode in statuses_after_signal(cmd[0], 75), (first.returncode, err[-2000:])
    saved = re.findall(rf"^saved step (\d+) to (.+) on {signal.name}; resume with --resume auto$", out, re.M)
    assert len(saved) == 1 and saved[0][1] == ck, out[-2000:]
    assert second.returncode == 2, second.stdout + second.stderr
    lines = own_lines(second.stderr)
    assert len(lines) == 1 and "is in use by another job (host " in lines[0], second.stderr  # one line
    assert ", pid " in lines[0] and ", started " in lines[0], second.stderr  # naming the first job
    assert "resuming" not in second.stdout and "epoch" not in second.stdout  # refused before training
    step = int(saved[0][0])
    found = store.newest_valid(ck, print)
    assert found is not None and store.latest(ck) == found[0] == os.path.join(ck, store.step_name(step))
    assert read_state(ck)["step"] == step  # the first job's last step: nothing of the second one's
