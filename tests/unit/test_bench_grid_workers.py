"""[DDP-scaling]'s model x data grid (one process) and the pure parts of [DDP-bench]'s all-reduce table."""

import argparse
import json

import pytest

from mpi_sgd.bench import grid, workers
from tests.helpers import prints_usage_errors


def test_grid_tiny_writes_table_json_and_png(tmp_path, capsys):
    from mpi_sgd.cli import main

    assert main(["bench", "grid", "--tiny", "--out-dir", str(tmp_path)]) == 0
    assert "| model | params | samples |" in capsys.readouterr().out
    rows = json.loads((tmp_path / "grid.json").read_text())["rows"]
    assert [(r["model"], r["samples"]) for r in rows] == [("0x10", 256), ("0x10", 2048), ("2x64", 256), ("2x64", 2048)]
    assert all(r["seconds"] > 0 for r in rows)
    assert rows[0]["params"] == 100 * 10 + 10 + 10 * 1 + 1  # 100 inputs, one hidden layer of 10, one output
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"


def test_grid_table_ratios():
    rows = [
        dict(model="a", params=10, samples=100, seconds=1.0),
        dict(model="b", params=100, samples=1000, seconds=80.0),
    ]
    assert grid.table(rows).splitlines()[-1].split("|")[5:7] == ["   80.0 ", "            100.0 "]


def test_model_spec():
    from mpi_sgd.args import depths_by_widths

    assert depths_by_widths("0x10, 3x100") == [(0, 10), (3, 100)]
    for bad in ("3", "x10", "-1x10", "2x0"):
        with pytest.raises(argparse.ArgumentTypeError):
            depths_by_widths(bad)


def test_workers_table_reads_like_the_seed():
    rows = [
        dict(backend="gloo", workers=2, bytes=10**6, avg_s=0.002193, min_s=0.002, max_s=0.0025),
        dict(backend="mpi4py", workers=2, bytes=10**9, avg_s=0.5, min_s=0.4, max_s=0.6),
    ]
    lines = workers.table(rows).splitlines()
    assert lines[0].split("|")[1:5] == [" Backend ", " Workers ", " Data Size ", " Time (s) "]
    assert "mpi4py" in lines[2] and "1000MB" in lines[2]  # mpi4py first, as the seam is ours
    assert "gloo" in lines[3] and "1MB" in lines[3] and "0.002193" in lines[3]


@pytest.mark.parametrize("args", [["--workers", "1,2"], ["--max-bytes", "1KB"], ["--backends", "ucx"]])
def test_workers_bad_arguments_exit_2(args, tmp_path, capsys):
    from mpi_sgd.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "workers", *args, "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert ("mpi-sgd bench workers: error:" in err) if prints_usage_errors() else err == ""  # rank 0 speaks for all
    assert not list(tmp_path.iterdir())  # nothing launched, nothing written
