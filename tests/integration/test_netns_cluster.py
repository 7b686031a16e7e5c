"""Two hosts for real: network namespaces joined by a veth pair, sshd on each (mpi_sgd.cluster.netns).

Needs root and ``ip netns``; openssh-server is installed on demand. Elsewhere these tests skip
and say why. Every job gets MPIEXEC_TIMEOUT and a subprocess timeout, so a hang fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mpi_sgd import checkpoint
from mpi_sgd.cluster import netns
from mpi_sgd.launch import mpiexec_command

from .conftest import ROOT

MPIEXEC = mpiexec_command(1)[0][0]


def _why_not() -> str | None:
    if why := netns.missing():
        return why
    version = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout
    if "HYDRA" not in version:  # -hosts a,b and -f host:N are hydra's syntax
        return f"the cluster commands are hydra's (MPICH); {MPIEXEC} is not hydra"
    return None


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"namespace cluster: {WHY_NOT}")
# The Makefile's netns-cluster target, the user's multi-host command exactly.
USER_COMMAND = "mpiexec -n 4 -hosts a,b python examples/sync_sgd.py"


@pytest.fixture(scope="module")
def cluster():
    try:
        netns.ensure_tools()
    except RuntimeError as e:
        pytest.skip(str(e))
    with netns.Cluster() as c:
        yield c
    assert c.leftovers() == []


def _env(cluster, timeout: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "OMPI_", "PMIX_"))}
    return cluster.env(
        {
            **env,
            "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
            "MPIEXEC_TIMEOUT": str(timeout),
            "OMP_NUM_THREADS": "1",
        }
    )


def on_a(cluster, cmd: list[str], timeout: int = 90):
    """Run ``cmd`` on host a as the launcher, with the cluster's ssh."""
    return cluster.run(cmd, env=_env(cluster, timeout), timeout=timeout + 30, cwd=ROOT)


def _left(output: str) -> set[str]:
    """What still exists of the cluster that printed ``output``: its namespaces, and processes
    holding its key directory. (Other clusters may be up meanwhile: their names differ.)"""
    tag = re.search(r"netns cluster (mpisgd-\d+-\d+):", output)[1]
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    procs = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
    return {n for n in names if n.startswith(tag)} | {p for p in procs if f"/run/{tag}-" in p}


def test_make_netns_cluster_runs_the_user_command_over_the_veth(cluster):
    """`make netns-cluster`: the exact command, gradients across the link, nothing left afterwards."""
    out = subprocess.run(["make", "-s", "netns-cluster"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"running on a: {USER_COMMAND}" in out.stdout
    assert "4 rank(s) x batch 32" in out.stdout
    steps = int(re.search(r"(\d+) steps; per step", out.stdout)[1])
    sent, received = map(int, re.search(r"sent (\d+) bytes .* received (\d+) bytes", out.stdout).groups())
    # Why this bound: after each step every rank holds the sum of all four ranks' gradients, so
    # host b must have learnt something of the size of host a's gradients (reduced on a or not)
    # and vice versa: at least P float32 values each way per step. Shared memory between the
    # hosts would leave the link nearly idle.
    params = sum(p.numel() for p in _simplenet().parameters())
    assert min(sent, received) >= steps * params * 4, (steps, params, sent, received)
    assert "nothing left behind" in out.stdout
    assert _left(out.stdout) == set()
    # Ended without a warning: UCX's "unexpected tag-receive descriptor" (a side-channel message
    # left for MPI_Finalize) came at the end of every run of this command before the watchdog drained it.
    assert not re.search(r"warn|unexpected", out.stdout + out.stderr, re.I), out.stderr[-3000:]


def _simplenet():
    from mpi_sgd.data import load
    from mpi_sgd.models import build_model

    digits = load("digits", 0)
    return build_model("simplenet", tuple(digits.x.shape[1:]), digits.num_outputs)


# One write per line: lines from different hosts then arrive whole, if in any order.
WHERE = [
    sys.executable,
    "-c",
    "from mpi4py import MPI; import socket, sys; "
    "sys.stdout.write(f'rank {MPI.COMM_WORLD.rank} on {socket.gethostname()}\\n')",
]


@pytest.mark.parametrize(
    "placement, expected",
    [(["-hosts", "a,b"], "abab"), (["-f", "hostfiles/hydra"], "aabb"), (["-f", "hostfiles/hydra-round-robin"], "abab")],
)
def test_hostfiles_place_ranks_as_their_comments_say(cluster, placement, expected):
    out = on_a(cluster, [MPIEXEC, "-n", "4", *placement, *WHERE], timeout=60)
    assert out.returncode == 0, out.stderr
    hosts = dict(re.findall(r"rank (\d) on (\w+)", out.stdout))
    assert "".join(hosts[str(r)] for r in range(4)) == expected, out.stdout


LAYOUT = [
    sys.executable,
    "-c",
    "from mpi_sgd.comm.backends.mpi import MPIComm; import sys; c = MPIComm(); "
    "c.alloc_shared(1); m = c._shm.mem; "
    "sys.stdout.write(f'rank {c.rank}: node of {m.size}, multi-node {m.multi_node}\\n')",
]


def test_shared_memory_all_reduce_is_hierarchical_across_the_hosts(cluster):
    """tests/mpi/test_shm.py's results on its real layout ("node"; the pretend ones run on one host)
    with ranks 0, 2 on a and 1, 3 on b: each host's two ranks share memory and the hosts' leaders
    all-reduce over the link. Every length, op and dtype against the one-process reference, the
    result against MPI's own all-reduce, and the trainer against one process at batch R*B."""
    out = on_a(cluster, [MPIEXEC, "-n", "4", "-hosts", "a,b", *LAYOUT], timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(out.stdout.splitlines()) == [f"rank {r}: node of 2, multi-node True" for r in range(4)]
    tests = [sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi", "-x", "-q", "-p", "no:cacheprovider"]
    tests += ["-k", "node and (every_length or hierarchical_equals or trainer_equals)", "tests/mpi/test_shm.py"]
    out = on_a(cluster, [MPIEXEC, "-n", "4", "-hosts", "a,b", *tests], timeout=240)
    ran = [int(n) for n in re.findall(r"(\d+) passed", out.stdout)]
    assert out.returncode == 0 and ran == [9] * 4, out.stdout[-3000:] + out.stderr[-3000:]


def test_doctor_passes_then_names_the_host_whose_sshd_is_down(cluster):
    doctor = [sys.executable, "-m", "mpi_sgd.cli", "doctor", "-hosts", "a,b"]
    ok = on_a(cluster, doctor, timeout=30)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    rows = {line.split()[0]: line.split() for line in ok.stdout.splitlines() if line.split()[:1] in (["a"], ["b"])}
    assert rows["a"][-1] == rows["b"][-1] == "ok" and "eth0" in rows["b"], ok.stdout
    cluster.stop_sshd("b")
    try:
        start = time.monotonic()
        bad = on_a(cluster, doctor, timeout=30)
        took = time.monotonic() - start
        assert bad.returncode == 1 and took < 15, (took, bad.stdout)
        assert re.search(r"First thing to fix: ssh to b failed: .*Connection refused", bad.stdout), bad.stdout
        start = time.monotonic()  # a host that is off: bounded by the doctor's ssh ConnectTimeout
        off = on_a(cluster, [*doctor[:-1], f"a,{netns.UNREACHABLE}"], timeout=30)
        assert off.returncode == 1 and time.monotonic() - start < 15, off.stdout
        assert f"First thing to fix: ssh to {netns.UNREACHABLE} failed" in off.stdout, off.stdout
    finally:
        cluster.start_sshd("b")
        cluster.wait_ssh("b")


def _final_parameters(path: Path) -> dict[str, torch.Tensor]:
    return checkpoint.read_state(str(path))["model"]  # the newest checkpoint in that directory


@pytest.mark.parametrize("backend", ["mpi4py", "gloo"])
def test_two_hosts_train_exactly_as_one_host(cluster, backend, tmp_path):
    """Same seed, same R = 2: the final parameters with one rank on each of a and b (every
    all-reduce over the link) equal those of both ranks on one host (shared memory), bit for bit.

    Why exact: the data, initial weights and per-rank dropout seeds do not depend on placement,
    and each backend sums the four gradients in an order fixed by rank, not by host (measured:
    MPICH's and gloo's all-reduce give identical bits here). A difference would mean the hosts
    disagreed about data or state, which no tolerance should hide.
    """
    args = ["examples/sync_sgd.py", "--backend", backend, "--max-steps", "8", "--no-progress"]
    two, one = tmp_path / "two.pt", tmp_path / "one.pt"
    out = on_a(cluster, [MPIEXEC, "-n", "2", "-hosts", "a,b", sys.executable, *args, "--checkpoint", str(two)])
    assert out.returncode == 0, out.stderr[-3000:]
    cmd, env = mpiexec_command(2, *args, "--checkpoint", str(one))
    local = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**env, "MPIEXEC_TIMEOUT": "90", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert local.returncode == 0, local.stderr[-3000:]
    a, b = _final_parameters(two), _final_parameters(one)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), (backend, name, (a[name] - b[name]).abs().max())


def _hydra_version() -> tuple[int, ...]:
    said = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"HYDRA build details:\s*\n\s*Version:\s*(\d+)\.(\d+)", said)
    return tuple(map(int, found.groups())) if found else ()


def test_failures_on_the_wire_end_the_job_naming_the_host():
    """Unresolvable host, a host that is off, sshd down, a worker killed or cut off mid-run: each
    ends the job in < 30 s with a message naming the host."""
    timings = {}
    # Hydra 4.0 (Debian 12's MPICH 4.0.2) names the host whose ssh failed, then waits for ranks that
    # will never start until MPIEXEC_TIMEOUT ends it; 5.0 ends the job itself, and must. (Versions
    # between were not tried.) The docs tell users of the older one to set MPIEXEC_TIMEOUT.
    waits = (0,) < _hydra_version() < (5,)
    launch_limit = 20 if waits else 60
    with netns.Cluster() as c:
        job = [MPIEXEC, "-n", "2", "-hosts"]  # one rank on each host
        train = [sys.executable, "examples/sync_sgd.py", "--epochs", "1000", "--no-progress"]

        def failed_launch(case: str, hosts: str):
            start = time.monotonic()
            out = on_a(c, [*job, hosts, *train], timeout=launch_limit)
            timings[case] = time.monotonic() - start
            assert out.returncode != 0, out.stderr
            ended_by_timeout = timings[case] >= launch_limit - 1
            assert waits or not ended_by_timeout, f"{case}: the launcher waited for MPIEXEC_TIMEOUT\n{out.stderr}"
            return out

        out = failed_launch("unresolvable host", "a,nosuchhost")
        assert "nosuchhost" in out.stderr, out.stderr

        # resolves, but nothing answers: ssh's ConnectTimeout bounds it
        out = failed_launch("host down (no machine at its address)", f"a,{netns.UNREACHABLE}")
        # ssh's own "connect to host down ..." or the launcher wrapper's "ssh to down failed ..."
        # (node.sh): under load ssh's line was once missing from what hydra forwarded before the
        # wrapper ended it, and the wrapper's line, which names the host too, was all there was.
        named = (f"host {netns.UNREACHABLE} ", f"ssh to {netns.UNREACHABLE} failed")
        assert any(n in out.stderr for n in named), out.stderr

        c.stop_sshd("b")
        out = failed_launch("sshd down on b", "a,b")
        assert re.search(r"host b .*Connection refused", out.stderr), out.stderr
        c.start_sshd("b")
        c.wait_ssh("b")

        def cut_mid_run(case: str, cut) -> str:
            p = c.popen(
                [*job, "a,b", *train],
                env=_env(c, 120),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for line in p.stdout:  # train until the first epoch is done on both hosts
                if line.startswith("epoch"):
                    break
            start = time.monotonic()
            cut()
            try:
                _, err = p.communicate(timeout=60)
            finally:
                p.kill()
            timings[case] = time.monotonic() - start
            assert p.returncode != 0, err[-2000:]
            return err

        err = cut_mid_run("b killed mid-run", lambda: c.kill_host("b"))
        assert "Connection to b closed" in err, err[-2000:]
        # A pulled cable (c.cut_link: no connection closes, ssh's ServerAlive notices in 15-20 s) is
        # left out here to keep the suite short; `python -m mpi_sgd.cluster.netns` can stage it by hand.
    assert c.leftovers() == []
    print("\n" + "\n".join(f"{case}: job ended after {s:.2f} s" for case, s in timings.items()))
    assert all(s < 30 for s in timings.values()), timings


def test_ctrl_c_tears_everything_down():
    p = subprocess.Popen(
        [sys.executable, "-m", "mpi_sgd.cluster.netns", "--", "sleep", "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as at a terminal: a suite started in the background by a shell without job control
        # inherits SIGINT ignored, and so would the cluster
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = p.stdout.readline()
        assert "running on a: sleep 60" in line, line + p.stderr.read()
        assert _left(line)  # up: namespaces and sshd exist
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)  # teardown is seconds; a loaded machine stretches it
    finally:
        p.kill()
    assert p.returncode == 130 and "interrupted" in err, (p.returncode, err)
    assert "nothing left behind" in out, out
    assert _left(line) == set()


def test_without_root_or_netns_the_cluster_says_why(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netns.missing() == "needs root (network namespaces, mounts)"
    rc = netns.main(["--", "true"])
    assert rc == 2


def test_the_make_target_runs_exactly_the_user_command():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^netns-cluster:.*\n((?:\t.*\n)+)", makefile, re.M)[1]
    assert recipe.replace("\\\n", " ").split(" -- ", 1)[1].split() == shlex.split(USER_COMMAND)
