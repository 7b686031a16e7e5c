"""`mpi-sgd doctor` on this machine alone: the launcher's host is probed without ssh, a name
that does not resolve is named at once. (Across real hosts: test_netns_cluster.py.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from .conftest import ROOT

DOCTOR = [sys.executable, "-m", "mpi_sgd.cli", "doctor"]


def doctor(*args: str):
    start = time.monotonic()
    done = subprocess.run([*DOCTOR, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - start


def test_this_host_alone_is_ready():
    done, _ = doctor("-f", "hostfiles/localhost")
    assert done.returncode == 0, done.stdout + done.stderr
    header, launcher, local = done.stdout.splitlines()[:3]
    assert header.split()[:3] == ["host", "address", "ssh"]
    assert local.split()[:3] == ["localhost", "127.0.0.1", "local"] and local.split()[-1] == "ok"
    assert done.stdout.splitlines()[-1].startswith("ready: 1 host(s)")


def test_an_unresolvable_host_is_named_first_and_fast():
    done, took = doctor("-hosts", f"{socket.gethostname()},no-such-host.invalid")
    assert done.returncode == 1 and took < 15, took
    assert "First thing to fix: no-such-host.invalid does not resolve here" in done.stdout


def test_bad_arguments_exit_2():
    done, _ = doctor("-hosts", "a:0")
    assert done.returncode == 2 and "a has 0 slots" in done.stderr
    done, _ = doctor("-f", "hostfiles/no-such-file")
    assert done.returncode == 2 and "cannot read hostfile" in done.stderr
