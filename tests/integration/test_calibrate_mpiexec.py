"""``mpiexec -n 2 python examples/speedup.py --calibrate`` end to end, then the saved file reused."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_sgd.calibrate import Calibration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "speedup.py"

if int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1:
    pytest.skip("launches its own mpiexec; not from inside an MPI job", allow_module_level=True)

MPIEXEC = os.environ.get("MPI_SGD_MPIEXEC") or shutil.which("mpiexec", path=str(Path(sys.executable).parent))
if not MPIEXEC:
    pytest.skip("no mpiexec (set MPI_SGD_MPIEXEC)", allow_module_level=True)


def test_calibrate_under_mpiexec_then_reuse(tmp_path):
    cal_path = tmp_path / "calibration.json"
    launch = [MPIEXEC, "-n", "2", sys.executable, str(SCRIPT), "--calibrate", "--max-bytes", "64KiB"]
    tiny = ["--layers", "16,32,4", "--batch", "8", "--save", str(cal_path), "--plot", str(tmp_path / "a.png")]
    out = subprocess.run(launch + tiny, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MPIEXEC_TIMEOUT": "100"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("measured at 2 rank(s)") == 1  # only the root prints

    cal = Calibration.load(cal_path)
    assert cal.meta["ranks"] == 2 and len(cal.sweep) == 8  # 4 B .. 64 KiB by factors of 4
    assert cal.network.alpha >= 0 and cal.network.beta > 0

    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--calibration", str(cal_path), "--plot", str(tmp_path / "b.png")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "| 8 |" in again.stdout.replace("|  8 |", "| 8 |")
