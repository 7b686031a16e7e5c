"""The machine-level parts of a namespace cluster: tools it needs, namespaces, their link and processes.

Kept apart from :class:`mpi_sgd.cluster.netns.Cluster`, which builds hosts out of these.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

PREFIX = "mpisgd-"  # every cluster's namespaces and key directories: mpisgd-<owner pid>-<n>-...


def missing() -> str | None:
    """Why a namespace cluster cannot run here, or None if it can (given :func:`ensure_tools`)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, mounts)"
    for tool in ("unshare", "nsenter"):
        if not shutil.which(tool):
            return f"needs {tool} (util-linux)"
    if not (shutil.which("ip") and shutil.which("ssh") and sshd_path()) and not shutil.which("apt-get"):
        return "needs iproute2, openssh-client and openssh-server (and no apt-get to install them)"
    return None


def sshd_path() -> str | None:
    return shutil.which("sshd") or ("/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None)


def ensure_tools() -> None:
    """Install iproute2 and openssh (apt-get) where missing; fail saying what if `ip netns` cannot work."""
    if not (shutil.which("ip") and shutil.which("ssh") and shutil.which("ssh-keygen") and sshd_path()):
        print("installing iproute2 and openssh (apt-get) for the namespace cluster", file=sys.stderr, flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        subprocess.run(
            [
                "apt-get",
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "iproute2",
                "openssh-client",
                "openssh-server",
            ],
            env=env,
            capture_output=True,
        )
    if not (shutil.which("ip") and shutil.which("ssh") and sshd_path()):
        raise RuntimeError("iproute2 or openssh could not be installed: install iproute2 and openssh-server")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(f"ip netns does not work here: {probe.stderr.strip()}")


def ip_cmd(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def link(namespaces: Sequence[str], addresses: Sequence[str], rate: str | None = None) -> None:
    """Join two namespaces by a veth pair, ``eth0`` at each end with its address (/24), both ends
    and loopback up; with ``rate`` (e.g. ``1gbit``) each end sends at most that, as a NIC of that
    speed would (tc's token bucket filter)."""
    a, b = namespaces
    # Made inside the namespaces, so the pair never shows in the machine's own `ip link`.
    ip_cmd("link", "add", "eth0", "netns", a, "type", "veth", "peer", "name", "eth0", "netns", b)
    for ns, address in zip(namespaces, addresses, strict=True):
        ip_cmd("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip_cmd("-n", ns, "link", "set", "lo", "up")
        ip_cmd("-n", ns, "link", "set", "eth0", "up")
        if rate:
            shape = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]
            done = subprocess.run(
                ["tc", "-n", ns, "qdisc", "add", "dev", "eth0", *shape], capture_output=True, text=True
            )
            if done.returncode != 0:
                raise RuntimeError(f"cannot shape the link to {rate}: {done.stderr.strip()}")


def host_command(ns: str, hosts_file: Path, name: str, shm_size: str) -> list[str]:
    """The command that makes a host inside network namespace ``ns``: UTS, mount, IPC and PID namespaces
    of its own, ``hosts_file`` as its /etc/hosts, a private /dev/shm of ``shm_size``, host name
    ``name``; its first process (a ``sleep``) holds them all until killed."""
    setup = (
        f"mount --bind {hosts_file} /etc/hosts && mount -t tmpfs -o size={shm_size},mode=1777 tmpfs "
        f"/dev/shm && hostname {name} && exec sleep infinity"
    )
    unshare = ["unshare", "--uts", "--mount", "--ipc", "--pid", "--fork", "--mount-proc"]
    return ["ip", "netns", "exec", ns, *unshare, "sh", "-c", setup]


def first_process(holder: subprocess.Popen, seconds: float = 10) -> int | None:
    """The pid of the host that :func:`host_command` started under ``holder``, once it is up; None if
    it did not come up within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        kids = children(holder.pid)
        if kids and Path(f"/proc/{kids[0]}/exe").resolve().name == "sleep":
            return kids[0]
        if holder.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def kill_namespace(ns: str) -> None:
    """SIGKILL every process in the network namespace until none is left (at most ~5 s)."""
    for _ in range(50):
        done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        pids = [int(p) for p in done.stdout.split()] if done.returncode == 0 else []
        live = [p for p in pids if alive(p)]
        if not live:
            return
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


@contextlib.contextmanager
def machine_lock():
    """Machine-wide: one cluster at a time creates namespaces or sweeps stale ones."""
    with open(Path(tempfile.gettempdir()) / "mpi-sgd-netns.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def sweep_stale() -> list[str]:
    """Remove namespaces and key directories of clusters whose owning process is gone."""
    swept = []
    for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX) and not Path(f"/proc/{name.split('-')[1]}").exists():
            kill_namespace(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            swept.append(name)
    for d in Path("/run").glob(f"{PREFIX}*"):
        if not Path(f"/proc/{d.name.split('-')[1]}").exists():
            shutil.rmtree(d, ignore_errors=True)
            swept.append(str(d))
    return swept
