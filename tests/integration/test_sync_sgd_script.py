"""examples/sync_sgd.py and the MPI tests, launched the way users launch them: under mpiexec.

They start their own jobs through ``conftest.run_mpi`` (which skips them inside an MPI job and
puts a timeout on every launch, so a hang fails the test instead of stalling the suite).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from .conftest import EXAMPLES, own_lines, run_mpi

SCRIPT = str(EXAMPLES / "sync_sgd.py")
# One thread per rank whatever the host: two or four ranks share two cores in CI.
ENV = {"OMP_NUM_THREADS": "1"}


def launch(n: int, *args: str, check: bool = True):
    return run_mpi(n, *args, env=ENV, check=check)


def test_demo_trains_and_writes_metrics(tmp_path):
    metrics, timeline, ckpt = tmp_path / "m.json", tmp_path / "t.json", tmp_path / "c.pt"
    out = launch(
        2,
        SCRIPT,
        "--epochs",
        "3",
        "--no-progress",
        "--metrics-json",
        str(metrics),
        "--timeline",
        str(timeline),
        "--checkpoint",
        str(ckpt),
    )
    assert "effective batch 64" in out.stdout
    m = json.loads(metrics.read_text())
    losses = [e["loss"] for e in m["epochs"]]
    assert losses[-1] < 0.7 * losses[0], losses  # it learns
    assert len(m["t_comp"]) == 2 and len(m["t_comp"][0]) == m["steps"] == len(m["t_sync"][1])
    events = json.loads(timeline.read_text())["traceEvents"]
    assert {"forward", "backward", "optimizer", "allreduce[0]"} <= {e["name"] for e in events}
    assert {e["tid"] for e in events} == {0, 1}
    assert ckpt.exists()


def bad_inputs(tmp_path):
    """One case per place a refusal is made; every message of each place is checked in tests/unit
    (test_training_parts.py, test_nonfinite_and_inputs.py, test_one_line_errors.py). A flag's value
    and a dataset smaller than R*B are the fault matrix's cases (test_faults.py), held to the same
    exit 2, one line and no traceback."""
    rng = np.random.default_rng(0)
    x, labels = rng.standard_normal((200, 4)).astype(np.float32), np.arange(200) % 3
    np.savez(tmp_path / "nox.npz", y=np.zeros(4))
    np.savez(tmp_path / "nan.npz", x=np.where(np.arange(800).reshape(200, 4) == 9, np.nan, x), y=labels)
    np.savez(tmp_path / "label.npz", x=x, y=np.where(np.arange(200) == 7, 100000, labels))
    (tmp_path / "file").write_text("")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all" * 20)
    return {
        "a file without x": (["--dataset", str(tmp_path / "nox.npz")], "no array named x"),
        "nan in data": (["--dataset", str(tmp_path / "nan.npz")], "x holds inf or nan in 1 sample(s)"),
        "label 100000": (["--dataset", str(tmp_path / "label.npz")], "would make C = 100001 classes"),
        "unwritable checkpoint": (["--checkpoint", str(tmp_path / "file" / "ck")], "cannot be created"),
        # after MPI starts: the root reads the checkpoint and broadcasts its verdict
        "resume garbage": (["--resume", str(tmp_path / "garbage.pt")], "not a torch checkpoint"),
    }


@pytest.mark.parametrize("refusing", [0, 1])
def test_a_rank_that_refuses_alone_names_itself_and_ends_the_job(refusing):
    """Two programs in one job (``mpiexec -n 1 a : -n 1 b``), one of them given a bad flag, as a
    data file missing on one host would be: the rank that passed its checks waits in MPI's
    start-up for the other, which under Hydra waits for ever. The refusing rank writes its line,
    naming itself where it is not rank 0, and ends the job, exit 2."""
    good, bad = [SCRIPT, "--epochs", "1"], [SCRIPT, "--epochs", "1", "--lr", "-1"]
    first, second = (bad, good) if refusing == 0 else (good, bad)
    out = run_mpi(1, *first, then=tuple(second), env=ENV, check=False, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = own_lines(out.stderr)
    where = "error:" if refusing == 0 else "error on rank 1 ("
    assert len(lines) == 1 and where in lines[0] and "--lr must be positive" in lines[0], out.stderr
    assert "epoch" not in out.stdout


def test_bad_input_one_message_exit_2_every_rank(tmp_path):
    for case, (args, message) in bad_inputs(tmp_path).items():
        out = launch(2, SCRIPT, *args, check=False)
        # hydra returns the worst exit status of the ranks: 2 means no rank crashed or hung
        assert out.returncode == 2, (case, out.returncode, out.stderr[-2000:])
        lines = own_lines(out.stderr)
        assert len(lines) == 1 and message in lines[0], (case, out.stderr)  # one line, from the root only
        assert "Traceback" not in out.stderr and "weights_only" not in out.stderr, case
        assert "epoch" not in out.stdout, case


def test_a_fault_the_run_never_reaches_is_one_line_exit_2():
    # step 100000 would never come, and a drill would report a clean run as a failure survived
    env = {**ENV, "MPI_SGD_FAULT": "1:100000:kill"}
    out = run_mpi(2, SCRIPT, "--epochs", "2", "--batch-size", "10", env=env, check=False)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = own_lines(out.stderr)
    assert len(lines) == 1 and re.search(r"step 100000, but this run ends at step \d+:", lines[0]), out.stderr
    assert "epoch" not in out.stdout
