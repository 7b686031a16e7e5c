"""ZeRO launched the way users launch it (its R = 4 equivalence tests are in test_four_ranks.py):
examples/07_zero.py at three ranks (the acceptance line), sync_sgd.py --zero with a checkpoint, and the benchmark
command at tiny sizes."""

from __future__ import annotations

import re

from .conftest import EXAMPLES, run_mpi

ENV = {"OMP_NUM_THREADS": "1"}  # two, three or four ranks share two cores


def table_rows(stdout: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines() if line.startswith("| ")]


def test_07_zero_at_three_ranks_prints_equality_and_memory():
    out = run_mpi(3, str(EXAMPLES / "07_zero.py"), "--layers", "32,64,64,64,1", "--steps", "3", env=ENV).stdout
    for stage in (1, 2, 3):
        assert re.search(
            rf"ZeRO-{stage} vs plain data parallel: max \|difference\| \S+ \(tolerance 1e-09\): equal", out
        )
    rows = {r[0]: [float(c) for c in r[1:]] for r in table_rows(out) if r[0] not in ("stage", "---")}
    assert len(rows) == 4, out
    plain, stage3 = rows["data parallel"], rows["ZeRO-3 (+ parameters)"]
    # measured total within padding of the formula, and a third of plain data parallel's at R = 3
    assert abs(plain[3] - plain[4]) <= 0.01 and abs(stage3[3] - stage3[4]) <= 0.01
    assert abs(stage3[3] - plain[3] / 3) <= 0.01


def test_sync_sgd_zero_trains_and_checkpoints_in_the_plain_format(tmp_path):
    """Resuming such a checkpoint at another R and stage is tested in tests/mpi/test_zero.py."""
    from mpi_sgd import checkpoint

    ckpt = tmp_path / "c.pt"
    args = ["--zero", "2", "--checkpoint", str(ckpt), "--model", "ffnet", "--dataset", "toy", "--batch-size", "64"]
    out = run_mpi(2, str(EXAMPLES / "sync_sgd.py"), *args, "--epochs", "2", "--no-progress", env=ENV).stdout
    assert "ZeRO stage 2 gradient averaging" in out
    losses = [float(x) for x in re.findall(r"epoch +\d+  loss (\S+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0]
    state = checkpoint.read_state(str(ckpt))  # the newest checkpoint in that directory, verified
    # consolidated by rank 0: whole tensors, one optimizer state per parameter, as plain data parallel saves
    assert state["world_size"] == 2 and state["model"]["layers.0.weight"].shape == (64, 100)
    assert len(state["optimizer"]["state"]) == len(state["model"]) == 8


def test_bench_zero_prints_three_tables(tmp_path):
    out = run_mpi(
        1,
        "-m",
        "mpi_sgd.cli",
        "bench",
        "zero",
        "--layers",
        "16,32,32,4",
        "--steps",
        "1",
        "--rounds",
        "1",
        "--out-dir",
        str(tmp_path),
        "--no-plot",
        env=ENV,
    ).stdout
    rows = {r[0]: r for r in table_rows(out)}
    assert {"local", "dp", "zero1", "zero2", "zero3"} <= rows.keys()
    volumes = re.findall(r"\| +(zero\d|dp) +\|.*\| +(\d\.\d+) Ψ \| +(\d) Ψ \|", out)
    assert {v: (round(float(m)), int(p)) for v, m, p in volumes} == {
        "dp": (2, 2),
        "zero1": (2, 2),
        "zero2": (2, 2),
        "zero3": (3, 3),
    }
    assert (tmp_path / "zero-n1.json").exists()
