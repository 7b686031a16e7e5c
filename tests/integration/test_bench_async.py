"""``mpi-sgd bench async`` as one process at a tiny size: it launches the job, reads its JSON, reports.
Structure only: which side wins is the benchmark's finding, not something a test can fix in advance."""

from __future__ import annotations

import json
import re

from .conftest import run_cli, widest_line


def test_bench_async_tiny(tmp_path):
    out = run_cli(
        *("bench", "async", "--scenarios", "base", "--ranks", "2", "--evaluations", "40", "--rounds", "2"),
        *("--out-dir", str(tmp_path)),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert widest_line(out.stdout) <= 120
    assert re.search(r"^\|\s+base \|\s+2 \|", out.stdout, re.MULTILINE), out.stdout
    assert re.search(
        r"^base R=2: expected async slower; (as expected|not as the model expects, here)", out.stdout, re.MULTILINE
    )

    report = json.loads((tmp_path / "async.json").read_text())
    job = report["jobs"][0]
    assert (job["ranks"], job["evaluations"], job["batch"]) == (2, 40, 32)
    for mode in ("sync", "async"):
        assert len(job["runs"][mode]) == 2  # two rounds, one of each order
        for run in job["runs"][mode]:
            seen = [s for _, s, _ in run["curve"]]
            assert seen[0] == 0 and seen[-1] == 40 * 32 and seen == sorted(seen)  # every gradient, in order
    assert all(sum(r["staleness"].values()) == 40 for r in job["runs"]["async"])
    assert (tmp_path / "async.png").read_bytes()[:4] == b"\x89PNG"
