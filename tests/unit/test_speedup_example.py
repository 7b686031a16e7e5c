"""examples/speedup.py as a user runs it: one process, no mpiexec."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_sgd import perfmodel as pm
from mpi_sgd.calibrate import Calibration, StepTiming, SweepPoint

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "speedup.py"
# Launcher variables from an enclosing mpiexec would make the child think it is one rank of many.
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_", "HYDRA_"))}
# One torch thread: on a shared test machine idle intra-op threads spin and slow a tiny model tenfold.
ENV["OMP_NUM_THREADS"] = "1"


def run(*args, cwd=None):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=ENV, cwd=cwd
    )


def speedups(stdout):
    rows = [line.split("|") for line in stdout.splitlines() if line.startswith("|") and "---" not in line]
    return {row[1].strip(): row[7].strip() for row in rows[1:]}


def test_break_even_figures(tmp_path):
    out = run("--t-comp", "1", "--t-sync", "1", "--ranks", "1,2,3,4", "--plot", str(tmp_path / "s.png"))
    assert out.returncode == 0, out.stderr
    assert speedups(out.stdout) == {"1": "1.00", "2": "1.00", "3": "1.50", "4": "2.00"}
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_network_preset_and_parameter_count(tmp_path):
    png = str(tmp_path / "p.png")
    out = run("--t-comp", "0.01", "--network", "1gbe", "--params", "10M", "--plot", png)
    assert out.returncode == 0, out.stderr
    # 40 MB of gradients over 1 GbE take ~0.35 s against 10 ms of compute: never pays.
    assert all(float(s) < 1 for r, s in speedups(out.stdout).items() if r != "1")


def test_calibration_file(tmp_path):
    cal = Calibration(pm.Network(1e-6, 1e-10), "ring", StepTiming(0.01, 64, 1000, "mlp"), (SweepPoint(4, 2, 1, 1, 1),))
    cal.save(tmp_path / "c.json")
    out = run("--calibration", str(tmp_path / "c.json"), "--plot", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr
    assert "ring all-reduce of 4,000 bytes" in out.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--t-comp", "-1", "--t-sync", "1"],
        ["--t-comp", "1", "--t-sync", "-0.5"],
        ["--t-comp", "1", "--t-sync", "1", "--ranks", "0,2"],
        ["--t-comp", "fast", "--t-sync", "1"],
        ["--t-comp", "1", "--t-sync", "1", "--batch-size", "two"],
        ["--t-comp", "1"],  # no T_sync source
        ["--t-comp", "1", "--network", "10gbe"],  # no gradient size
        ["--t-comp", "1", "--alpha", "1e-6"],  # alpha without beta
        ["--t-comp", "1", "--t-sync", "1", "--scaling", "strong", "--batch-size", "4", "--ranks", "8"],
        ["--calibration", "no-such-file.json", "--t-sync", "1"],
        ["--calibrate", "--t-sync", "1", "--layers", "784"],  # an MLP needs two widths
    ],
)
def test_bad_input_exits_2_before_anything(args, tmp_path):
    out = run(*args, "--plot", str(tmp_path / "p.png"))
    assert out.returncode == 2, (out.stdout, out.stderr)
    # a malformed value comes with the usage; a combination of flags it cannot use, in one line
    assert "speedup.py: error: " in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "p.png").exists()


def test_calibrate_as_one_process_with_a_network(tmp_path):
    out = run(
        "--calibrate",
        "--network",
        "10gbe",
        "--layers",
        "8,16,4",
        "--batch-size",
        "4",
        "--save",
        str(tmp_path / "c.json"),
        "--plot",
        str(tmp_path / "p.png"),
    )
    assert out.returncode == 0, out.stderr
    cal = Calibration.load(tmp_path / "c.json")
    assert cal.step.params == 8 * 16 + 16 + 16 * 4 + 4 and cal.sweep == ()
