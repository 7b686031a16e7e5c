"""examples/will_it_fit.py as a user runs it: one process, plain arithmetic."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "will_it_fit.py"
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_", "HYDRA_"))}


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=ENV)


def rows(stdout):
    return [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines() if line.startswith("| ")]


def test_the_papers_figure_1():
    out = run("--params", "7.5B", "--precision", "mixed", "--ranks", "64", "--memory", "32GiB")
    assert out.returncode == 0, out.stderr
    table = [r for r in rows(out.stdout) if r[0] == "64" and len(r) == 7]
    # 120 GB, 31.4 GB, 16.6 GB, 1.9 GB in the paper (decimal GB) are these GiB
    assert [r[5] for r in table] == ["111.8", "29.2", "15.5", "1.75"]
    assert [r[6] for r in table] == ["no", "yes", "yes", "yes"]


def test_largest_model_per_stage():
    out = run("--params", "1M", "--ranks", "8", "--memory", "16GiB")
    assert out.returncode == 0, out.stderr
    largest = [r for r in rows(out.stdout) if r[0] == "8" and len(r) == 5][0]
    # 16 GiB / 16 B, / (8 + 8/8) B, / (4 + 12/8) B, / (16/8) B
    assert largest[1:] == [f"{n:,}" for n in (2**30, 16 * 2**30 // 9, 16 * 2**30 * 8 // 44, 2**33)]


def test_bad_count_exits_2():
    out = run("--params", "lots")
    assert out.returncode == 2 and "argument --params: not a number: 'lots'" in out.stderr
