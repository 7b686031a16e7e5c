"""The pipeline launched the way users launch it: examples/08_pipeline.py (its MPI tests at R = 4 are
in test_four_ranks.py)."""

from __future__ import annotations

import json
import re

from .conftest import EXAMPLES, own_lines, run_mpi

ENV = {"OMP_NUM_THREADS": "1"}  # three or four ranks share two cores in CI


def test_08_pipeline_checks_equality_and_prints_the_bubble_table(tmp_path):
    trace = tmp_path / "pipeline.json"
    out = run_mpi(3, str(EXAMPLES / "08_pipeline.py"), "--schedule", "1f1b", "--timeline", str(trace), env=ENV).stdout
    assert re.search(
        r"3 stage\(s\), layers cut at \[0, 2, 4, 6\], 1f1b, m = 4: parameters and loss vs the unsplit model\n"
        r"  after 3 steps: max \|difference\| \S+ \(tolerance 1e-12\): equal",
        out,
    ), out
    for m, ideal in ((1, 0.667), (2, 0.5), (4, 0.333), (8, 0.2)):  # (R-1)/(m+R-1) at R = 3
        assert re.search(rf"\|\s+{m} \|\s+[\d.]+ \|\s+[\d.]+ \|\s+{ideal:.3f} \|", out), out
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["tid"] for e in events} == {0, 1, 2} and {e["ph"] for e in events} == {"X"}
    assert sorted(e["name"] for e in events if e["tid"] == 1) == sorted(f"{k}{i}" for k in "FB" for i in range(4))


def test_08_pipeline_refuses_a_batch_it_cannot_cut_with_exit_2():
    proc = run_mpi(1, str(EXAMPLES / "08_pipeline.py"), "--batch-size", "4", env=ENV, check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert own_lines(proc.stderr) == [  # one line: a value the flags refuse together, not a typo
        "08_pipeline.py: error: --batch-size 4 cannot be cut into 8 micro-batches: give at least 8"
    ]
