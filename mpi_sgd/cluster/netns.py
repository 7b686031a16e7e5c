"""Two hosts on one machine: network namespaces joined by a veth pair, each running sshd.

    python -m mpi_sgd.cluster.netns -- mpiexec -n 4 -hosts a,b python examples/sync_sgd.py

(root; ``make netns-cluster`` runs exactly that; iproute2 and openssh are installed through
apt-get where missing). Each host is

* a network namespace whose only link is ``eth0``, one end of a veth pair (10.200.0.1 and .2);
* a mount namespace with its own ``/etc/hosts`` (naming both hosts, and ``down``, an address no
  machine answers) and its own ``/dev/shm``;
* UTS and PID namespaces of its own, so it has its host name and MPI cannot find the other
  host's processes through ``/proc`` or shared memory: ranks on different hosts must use the
  network, as between machines, while ranks on one host share memory as usual;
* an sshd set up by ``node.sh`` (the script the Docker cluster runs) with keys made for this
  cluster only.

The command runs on the first host with ``HYDRA_LAUNCHER_EXEC`` set to the cluster's ssh, so
hydra's ``-hosts a,b`` reaches b over the veth link. The byte counters of ``eth0`` before and
after show what crossed it.

Names carry the owner's pid (``mpisgd-<pid>-<n>-<host>``), so two clusters never collide, and
a cluster whose owner was killed outright is swept away by the next one. Teardown (kill every
process in each namespace, delete the namespaces, and with them the veth pair, remove the keys)
runs on success, failure, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..args import ArgumentParser, flag
from .namespaces import (
    PREFIX,
    alive,
    children,
    ensure_tools,
    first_process,
    host_command,
    ip_cmd,
    kill_namespace,
    link,
    machine_lock,
    missing,
    sweep_stale,
)

NODE_SH = Path(__file__).with_name("node.sh")
SUBNET = "10.200.0"
PORT = 2222
SHM_SIZE = "1g"
UNREACHABLE = "down"  # a third name in the hosts file, for a host that is switched off
_instances = itertools.count()


class Cluster:
    """Two hosts as namespaces; a context manager that always tears down what it made."""

    def __init__(self, hosts: tuple[str, str] = ("a", "b"), port: int = PORT, rate: str | None = None):
        if len(hosts) != 2 or len(set(hosts)) != 2:
            raise ValueError(f"a namespace cluster has two distinct hosts, got {hosts}")
        self.hosts = list(hosts)
        self.port = port
        self.rate = rate  # e.g. "1gbit": the link shaped like a real network (tc's token bucket)
        self.tag = f"{PREFIX}{os.getpid()}-{next(_instances)}"
        self.ns = {h: f"{self.tag}-{h}" for h in hosts}
        self.address = {h: f"{SUBNET}.{i + 1}" for i, h in enumerate(hosts)}
        self.pid1: dict[str, int] = {}  # each host's first process (its PID namespace's init)
        self.sshd: dict[str, subprocess.Popen] = {}
        self._procs: list[subprocess.Popen] = []
        self.dir: Path | None = None

    # -- bring-up and teardown -----------------------------------------------------------
    def __enter__(self) -> Cluster:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        ensure_tools()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        with machine_lock():
            sweep_stale()
            for ns in self.ns.values():
                ip_cmd("netns", "add", ns)
        link([self.ns[h] for h in self.hosts], [self.address[h] for h in self.hosts], self.rate)
        # Under /run (root-owned, not world-writable): sshd refuses keys below a directory that is.
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-", dir="/run"))
        hosts_file = self.dir / "hosts"
        # UNREACHABLE resolves, but no machine has its address: a host that is down.
        hosts_file.write_text(
            "127.0.0.1 localhost\n"
            + "".join(f"{self.address[h]} {h}\n" for h in self.hosts)
            + f"{SUBNET}.3 {UNREACHABLE}\n"
        )
        hosts_file.chmod(0o644)
        self._node("keys", self.dir / "keys")
        self._node("client", self.dir / "client", str(self.port), self.dir / "keys")
        for h in self.hosts:
            self._node("sshd", self.dir / h, str(self.port), self.dir / "keys")
            self._start_host(h)
            self.start_sshd(h)
        self.wait_ssh(*self.hosts)

    def wait_ssh(self, *hosts: str) -> None:
        """Until every host in ``hosts`` answers ssh from the first host (at most 20 s)."""
        self.run([str(NODE_SH), "wait-ssh", str(self.dir / "client"), "20", *hosts], check=True, timeout=30)

    def down(self) -> None:
        """Kill everything in the namespaces, delete them (the veth pair goes with them), remove keys."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for ns in self.ns.values():
                kill_namespace(ns)
            for p in self._procs:
                with contextlib.suppress(OSError):
                    p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
            deadline = time.monotonic() + 5  # the kernel ends a PID namespace's last processes shortly after
            while any(alive(pid) for pid in self.pid1.values()) and time.monotonic() < deadline:
                time.sleep(0.05)
            for ns in self.ns.values():
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (empty after down())."""
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        left = [f"namespace {ns}" for ns in self.ns.values() if ns in names]
        left += [f"process {p.pid}" for p in self._procs if alive(p.pid)]
        left += [f"process {pid} (host {h})" for h, pid in self.pid1.items() if alive(pid)]
        if self.dir is not None and self.dir.exists():
            left.append(f"directory {self.dir}")
        return left

    def _node(self, *args) -> None:
        subprocess.run([str(NODE_SH), *map(str, args)], check=True, capture_output=True)

    def _start_host(self, h: str) -> None:
        command = host_command(self.ns[h], self.dir / "hosts", h, SHM_SIZE)
        pid = first_process(self._popen(command))
        if pid is None:
            raise RuntimeError(f"host {h} did not start (namespace setup failed: {command[-1]})")
        self.pid1[h] = pid

    def _popen(self, cmd, **kw) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, **kw)
        self._procs.append(p)
        return p

    # -- using the hosts -----------------------------------------------------------------
    def enter(self, host: str, cwd: str | None = None) -> list[str]:
        """The prefix that runs a command on ``host`` (in all of its namespaces)."""
        return ["nsenter", "-t", str(self.pid1[host]), "-n", "-m", "-u", "-i", "-p", f"--wd={cwd or os.getcwd()}"]

    def env(self, base: dict | None = None) -> dict[str, str]:
        """The launcher's environment: hydra (and mpi-sgd doctor) use the cluster's ssh."""
        return {**(os.environ if base is None else base), "HYDRA_LAUNCHER_EXEC": str(self.dir / "client" / "ssh")}

    def popen(self, cmd: list[str], host: str | None = None, **kw) -> subprocess.Popen:
        kw.setdefault("env", self.env())
        return self._popen([*self.enter(host or self.hosts[0]), *cmd], **kw)

    def run(self, cmd: list[str], host: str | None = None, timeout: float | None = None, check: bool = False, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        p = self.popen(cmd, host, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        except BaseException:
            p.kill()
            p.wait()
            raise
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} on {host or self.hosts[0]} failed (exit {p.returncode}): {err or ''}")
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)

    def start_sshd(self, h: str) -> None:
        log = open(self.dir / f"sshd-{h}.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.sshd[h] = self._popen(
            [*self.enter(h, "/"), str(NODE_SH), "serve", str(self.dir / h)],
            stdout=log,
            stderr=log,
            env={"PATH": os.environ.get("PATH", "")},
        )
        log.close()

    def stop_sshd(self, h: str) -> None:
        """sshd on ``h`` goes away; the host stays up (connections to it are refused)."""
        p = self.sshd.pop(h)
        for child in children(p.pid):  # nsenter forked into the PID namespace; sshd is its child
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)
        p.wait(timeout=10)

    def kill_host(self, h: str) -> None:
        """Every process on ``h`` dies at once (a crashed node); the link stays up."""
        kill_namespace(self.ns[h])
        self.sshd.pop(h, None)

    def start_host(self, h: str) -> None:
        """``h`` boots again after :meth:`kill_host`: fresh namespaces, sshd, link up."""
        self._start_host(h)
        self.start_sshd(h)
        ip_cmd("-n", self.ns[h], "link", "set", "eth0", "up")
        self.wait_ssh(h)

    def cut_link(self, h: str) -> None:
        """``h`` goes silent (a pulled cable): its end of the link goes down, nothing is closed."""
        ip_cmd("-n", self.ns[h], "link", "set", "eth0", "down")

    def counters(self, h: str) -> tuple[int, int]:
        """Bytes (received, sent) by ``h``'s eth0 so far."""
        stats = json.loads(ip_cmd("-n", self.ns[h], "-j", "-s", "link", "show", "dev", "eth0"))[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass(frozen=True)
class Flags:
    hosts: str = flag("a,b", "the two host names")
    rate: str | None = flag(
        None, "shape the link like a real network, e.g. 1gbit or 10gbit (default: as fast as the machine moves bytes)"
    )
    command: list = flag([], "what to run on the first host, after --", rest=True)

    def __post_init__(self):
        if not self.command[self.command[:1] == ["--"] :]:
            raise ValueError("give the command to run after --")


def main(argv: list[str] | None = None) -> int:
    args = ArgumentParser(prog="python -m mpi_sgd.cluster.netns", description=__doc__).parse_flags(Flags, argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    hosts = tuple(h.strip() for h in args.hosts.split(","))
    if why := missing():
        print(f"netns cluster: cannot run here: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    rc = 1
    cluster = Cluster(hosts, rate=args.rate)
    try:
        with cluster:
            a, b = cluster.hosts
            link = f"a veth pair{f' shaped to {args.rate}' if args.rate else ''}"
            print(
                f"netns cluster {cluster.tag}: hosts {a} ({cluster.address[a]}) and {b} ({cluster.address[b]}), "
                f"linked by {link}; "
                f"sshd on each; running on {a}: {' '.join(command)}",
                flush=True,
            )
            before = cluster.counters(a)
            start = time.monotonic()
            rc = cluster.popen(command).wait()
            took = time.monotonic() - start
            rx, tx = (after - was for after, was in zip(cluster.counters(a), before, strict=True))
            print(
                f"netns cluster: {a}'s eth0 (the link to {b}) sent {tx} bytes ({tx / 1e6:.1f} MB) and "
                f"received {rx} bytes ({rx / 1e6:.1f} MB) during the command ({took:.1f} s, exit {rc})"
            )
    except KeyboardInterrupt:
        print("netns cluster: interrupted", file=sys.stderr)
        rc = 130
    except RuntimeError as e:
        print(f"netns cluster: {e}", file=sys.stderr)
        rc = 1
    left = cluster.leftovers()
    print(f"netns cluster: torn down{': LEFT BEHIND ' + ', '.join(left) if left else ', nothing left behind'}")
    return rc or (1 if left else 0)


if __name__ == "__main__":
    sys.exit(main())
