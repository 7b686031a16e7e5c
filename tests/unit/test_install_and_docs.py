"""The install picks the torch build the README and the Setup page promise, and the docs, the
Makefile, the hostfiles and the commands' defaults say the same thing.

`make venv-torch` is run for real, with a stand-in `python` (it records what it was asked and
answers as a machine with or without a local wheel, a reachable CPU index and a GPU would) and
a stand-in `nvidia-smi`, so every branch is taken here in milliseconds, with no download.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_sgd.bench.workers import default_workers
from tests.helpers import standalone_env

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MULTI_HOST = (ROOT / "docs" / "use" / "multi-host.md").read_text()

STAND_IN = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in
  *--no-index*) exit "$LOCAL_WHEEL" ;;
  *urlopen*) exit "$CPU_INDEX" ;;
esac
exit 0
"""


def executable(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def venv_torch(tmp_path, local_wheel: bool, cpu_index: bool, gpu: bool, build: str = "auto"):
    """Run `make venv-torch`; return (exit status, stdout, stderr, the pip/python calls made)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    executable(bin_dir / "nvidia-smi", f"#!/bin/sh\nexit {0 if gpu else 1}\n")  # hides any real one
    python = executable(tmp_path / "python", STAND_IN)
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "CALLS": str(calls),
        "LOCAL_WHEEL": "0" if local_wheel else "1",
        "CPU_INDEX": "0" if cpu_index else "1",
    }
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "venv-torch", f"PY={python}", f"TORCH_BUILD={build}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr, calls.read_text().splitlines() if calls.exists() else []


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@needs_make
def test_cpu_machine_with_a_local_wheel_uses_it_and_nothing_else(tmp_path):
    rc, out, _, calls = venv_torch(tmp_path, local_wheel=True, cpu_index=False, gpu=False)
    assert rc == 0 and "CPU build, from a local wheel" in out
    assert calls == ["-m pip install -q --no-compile --no-index --no-deps torch==2.13.0"]  # no network touched


@needs_make
def test_cpu_machine_without_a_local_wheel_takes_the_cpu_index(tmp_path):
    rc, out, _, calls = venv_torch(tmp_path, local_wheel=False, cpu_index=True, gpu=False)
    assert rc == 0 and "CPU build, from https://download.pytorch.org/whl/cpu" in out
    assert "timeout=5" in calls[1]  # an unreachable index costs seconds, not pip's retries
    assert (
        calls[2]
        == "-m pip install -q --no-compile --no-deps --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"
    )


@needs_make
def test_cpu_machine_with_neither_says_it_falls_back_to_the_cuda_build(tmp_path):
    rc, _, err, calls = venv_torch(tmp_path, local_wheel=False, cpu_index=False, gpu=False)
    assert rc == 0 and "the CUDA build on Linux x86_64 (gigabytes)" in err
    assert len(calls) == 2  # tried the wheel and the index; the package index comes with the rest


@needs_make
def test_gpu_machine_gets_the_cuda_build_unless_told_cpu(tmp_path):
    rc, out, _, calls = venv_torch(tmp_path, local_wheel=True, cpu_index=True, gpu=True)
    assert (
        rc == 0 and "CUDA on Linux x86_64" in out and calls == ["-m pip install -q --no-compile torch===2.13.0"]
    )  # === : not a local +cpu
    (tmp_path / "told").mkdir()
    rc, out, _, _ = venv_torch(tmp_path / "told", local_wheel=True, cpu_index=True, gpu=True, build="cpu")
    assert rc == 0 and "CPU build" in out


@needs_make
def test_unknown_torch_build_is_refused(tmp_path):
    rc, _, err, _ = venv_torch(tmp_path, local_wheel=True, cpu_index=True, gpu=False, build="rocm")
    assert rc != 0 and "TORCH_BUILD must be auto, cpu or cuda, not 'rocm'" in err


def test_make_test_runs_the_readme_command_exactly():
    recipe = re.search(r"^test-mpirun:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert recipe == 'PATH="$(BIN):$$PATH" mpirun -n 2 pytest --with-mpi'  # the venv activated, then the command
    assert "```bash\nmpirun -n 2 pytest --with-mpi\n```" in README
    assert re.search(r"^test: .*\btest-mpirun\b", (ROOT / "Makefile").read_text(), re.M)


def test_license_is_an_spdx_string():
    # A TOML table here made setuptools print a deprecation warning three times per install.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "MIT"
    assert "setuptools>=77" in meta["build-system"]["requires"]  # the first to read that form


def test_hostfiles_name_the_hosts_the_readme_uses():
    hosts = re.search(r"mpiexec -n 4 -hosts (\S+) python", README).group(1).split(",")
    for name in ("hydra", "openmpi"):
        lines = [ln for ln in (ROOT / "hostfiles" / name).read_text().splitlines() if ln and not ln.startswith("#")]
        assert [re.split(r"[: ]", ln)[0] for ln in lines] == hosts, name
    assert f"blocks: 0,1 on {hosts[0]}; 2,3 on {hosts[1]}" in MULTI_HOST


def test_bench_workers_defaults_fit_the_cores():
    assert default_workers(2) == [2] and default_workers(1) == [2]  # an all-reduce needs two
    assert default_workers(4) == [2, 4] and default_workers(64) == [2, 4, 6]


def test_speedup_writes_a_png_only_with_plot(tmp_path):
    env = standalone_env()
    script = str(ROOT / "examples" / "speedup.py")
    done = subprocess.run(
        [sys.executable, script, "--t-comp", "1", "--t-sync", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "plot written" not in done.stdout, done.stderr
    assert list(tmp_path.iterdir()) == []  # no results/ folder, no PNG


@needs_make
def test_system_mpi_without_a_compiler_wrapper_is_one_line_naming_the_package(tmp_path):
    # mpi4py must be built against a system MPI's mpicc; without one pip would fail 60 lines later.
    env = {**standalone_env(), "MPICC": "no-such-mpicc"}
    done = subprocess.run(
        ["make", "--no-print-directory", "venv", "MPI=system", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert said[0].startswith("make venv MPI=system: no mpicc on PATH"), said
    assert "apt-get install libmpich-dev" in said[0]
    assert not (tmp_path / "venv").exists()  # refused before anything was made
