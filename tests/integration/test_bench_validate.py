"""``mpi-sgd bench validate`` as one process at tiny sizes: it calibrates, trains under mpiexec and
reports. Structure only: whether the model meets its 10% target is the benchmark's business."""

from __future__ import annotations

import json
import re

from .conftest import run_cli, widest_line


def test_validate_tiny(tmp_path):
    out = run_cli(
        *("bench", "validate", "--batches", "4", "--ranks", "1,2", "--max-steps", "12", "--max-bytes", "1MiB"),
        *("--repeats", "1", "--out-dir", str(tmp_path)),
    )
    # Exit 1 is the benchmark's verdict that the model called the wrong side of break-even; at 12
    # steps on a busy machine that can happen, and a timed verdict is not what this test checks.
    wrong_side = "MISSED: speedup < 1 exactly where predicted (wrong side beyond the spread" in out.stdout
    assert out.returncode == 0 or (out.returncode == 1 and wrong_side), out.stdout + out.stderr
    assert widest_line(out.stdout) <= 120
    assert "| config | R | pred step (ms) | meas step (ms) | error % |" in out.stdout
    assert re.search(r"^\|\s+B=4 \|\s+2 \|", out.stdout, re.MULTILINE)
    assert re.search(r"^(met|MISSED|inconclusive): \|error\| <= 10% at R = 1, 2", out.stdout, re.MULTILINE)
    assert "OMP_NUM_THREADS=1" in out.stdout  # every launched job says how it ran

    report = json.loads((tmp_path / "validate.json").read_text())
    assert [(r["batch"], r["ranks"]) for r in report["rows"]] == [(4, 1), (4, 2)]
    one, two = report["rows"]
    assert one["t_sync_over_t_comp"] == 0 and two["t_sync_over_t_comp"] > 0
    assert one["pred_speedup"] == 1 == one["meas_speedup"]
    assert all(r["measured"] > 0 and r["t_step"] > 0 for r in report["rows"])
    assert len(report["verdicts"]) == 2 and report["runs"]["B=4"][0]["grad_bytes"] == 4 * 1_863_690
    assert len(report["repeats"]) == 1 and two["spread"]["measured"] == [two["measured"]] * 3
    assert (tmp_path / "validate.png").read_bytes()[:4] == b"\x89PNG"
