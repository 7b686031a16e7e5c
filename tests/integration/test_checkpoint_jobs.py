"""Two real jobs in one ``--checkpoint`` directory: the second is refused in one line naming the
first, while the first trains on; afterwards ``latest`` names the newest checkpoint that verifies
(the one ``--resume auto`` takes), written by the first job alone. The first job's saves are slowed
(``MPI_SGD_SAVE_FAULT=slow:10``): after its first checkpoint appears it has two more saves to make,
about 20 s, while the second job takes 2-3 s to be refused on a quiet host. With 4 s saves (8 s to
spare) the first job once ended before the second was refused: Open MPI's launcher under the whole
integration suite's load (two files at a time on two cores) took longer than that to start it."""

from __future__ import annotations

import os
import subprocess
import time

from mpi_sgd.checkpoint import read_state, store
from mpi_sgd.launch import mpiexec_command

from .conftest import EXAMPLES, ROOT, own_lines, run_mpi

TRAIN = ("--epochs", "1000", "--max-steps", "250", "--no-progress", "--val-fraction", "0", "--batch-size", "8")


def test_a_second_job_is_refused_and_the_first_keeps_its_checkpoints(tmp_path):
    ck = str(tmp_path / "ck")
    cmd, env = mpiexec_command(2, str(EXAMPLES / "sync_sgd.py"), *TRAIN, "--checkpoint", ck)
    env = {**env, "MPI_SGD_SAVE_FAULT": "slow:10"}
    first = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not store.checkpoints(ck) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    second = run_mpi(2, str(EXAMPLES / "sync_sgd.py"), *TRAIN, "--checkpoint", ck, "--resume", "auto", check=False)
    assert first.poll() is None, "the first job ended before the second was refused: the test proves nothing"
    out, _ = first.communicate(timeout=240)
    assert first.returncode == 0, out
    assert second.returncode == 2, second.stdout + second.stderr
    lines = own_lines(second.stderr)
    assert len(lines) == 1 and "is in use by another job (host " in lines[0], second.stderr  # one line
    assert ", pid " in lines[0] and ", started " in lines[0], second.stderr  # naming the first job
    assert "resuming" not in second.stdout and "epoch" not in second.stdout  # refused before training
    found = store.newest_valid(ck, print)
    assert found is not None and store.latest(ck) == found[0] == os.path.join(ck, store.step_name(250))
    assert read_state(ck)["step"] == 250  # the first job's last step: nothing of the second one's
