"""``mpi-sgd bench goodput`` as one process at tiny sizes: steps to a target at two batches, the fit,
two real jobs and the report. Structure and arithmetic only: whether the model meets the project's
targets is the benchmark's business, on a quiet machine (docs/measured/goodput.md)."""

from __future__ import annotations

import json
import math
import re

import pytest

from mpi_sgd.perfmodel import steps_to_target

from .conftest import run_cli, widest_line


# About 23 CPU-seconds of training in one process: 17-20 s alone, 60-65 s beside another file's
# jobs on two cores (make test's JOBS=2). The suite's 120 s would leave too little margin.
@pytest.mark.timeout(300)
def test_goodput_tiny(tmp_path):
    out = run_cli(
        *("bench", "goodput", "--seeds", "1", "--multiples", "1,2,4", "--lrs", "0.03,0.1", "--ranks", "1,2"),
        *("--transports", "shm", "--max-steps", "400", "--job-repeats", "1", "--out-dir", str(tmp_path)),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert widest_line(out.stdout) <= 120
    assert "| global batch | tuned lr | steps | predicted | error | sqrt rule lr | rule steps |" in out.stdout
    assert re.search(r"^project target: predicted steps within 35% .*: (met|not met here)", out.stdout, re.M)
    assert re.search(r"^project target: shm: the model names the fastest R: (met|not met here)", out.stdout, re.M)

    report = json.loads((tmp_path / "goodput.json").read_text())
    assert [r["batch"] for r in report["rows"]] == [8, 16, 32]
    fit = report["fit"]
    for r in report["rows"]:  # each prediction is the fitted model at that batch
        assert math.isclose(r["predicted"], steps_to_target(r["batch"], fit["s_min"], fit["b_noise"]), rel_tol=1e-12)
    assert [(j["ranks"], j["transport"]) for j in report["jobs"]] == [(1, "shm"), (2, "shm")]
    for j in report["jobs"]:
        assert j["record"]["reached"] and j["seconds_predicted"] > 0 and j["t_step_predicted"] > 0
        assert 0 <= j["record"]["eval_s"] < j["record"]["wall_s"]
    assert (tmp_path / "goodput.png").read_bytes()[:4] == b"\x89PNG"
