"""``mpi-sgd doctor``: find what would break a multi-host run before MPI starts.

    mpi-sgd doctor -hosts a,b          # the hosts you would give mpiexec
    mpi-sgd doctor -f hostfiles/hydra  # or its hostfile (hydra or Open MPI format)
    mpi-sgd doctor --clean             # remove what killed MPI jobs left in /dev/shm and /tmp

For every host: does its name resolve here; does ssh reach it in batch mode (no password
prompt) within the timeout; does it have the same python (same path: the same venv or a shared
filesystem), mpi4py, MPI library (name, version, ABI) and torch as this launcher; which
interface it would use to reach the other hosts and the launcher (hydra's proxies connect back
to the launcher by name); how large its /dev/shm is. One table, then either "ready" (exit 0)
or the first thing to fix (exit 1).

It never hangs: every probe runs in its own thread under a deadline, and ssh gets
``BatchMode=yes`` and a ``ConnectTimeout``. ssh is whatever mpiexec would use: the command in
``HYDRA_LAUNCHER_EXEC`` if set, else ``ssh``. The launcher's own host (and any name that is
one of its addresses) is probed without ssh, as hydra starts local ranks without it.

Why one module of over 300 lines: probing, comparing and the table all read and write the same
:class:`HostReport`, and each check's column, rule and one-line fix sit together; the probe that
runs on every host is :mod:`.probe`, and ``--clean``'s work is :mod:`.residue`'s.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..args import UsageError, add_command, flag, positive_float
from .hosts import parse_hosts_option, read_hostfile, unique_names

PROBE = Path(__file__).with_name("probe.py")
# MPI puts ranks that share a host in shared memory under /dev/shm; Docker gives containers
# 64 MiB, and MPI then dies with SIGBUS (bus error) once its segments outgrow it.
SHM_MIN = 256 << 20
# Interfaces that are not a path between hosts: loopback and the bridges of local containers
# and VMs. Hosts that reach each other through one of these will hang or talk to themselves.
LOCAL_BRIDGES = ("lo", "docker", "br-", "virbr", "veth", "cni", "flannel")
# Problems are reported in this order: a host that does not resolve cannot be ssh'd to, etc.
KINDS = ("resolve", "ssh", "software", "network", "shm")


@dataclass
class HostReport:
    name: str
    address: str = "-"
    local: bool = False
    ssh: str = "-"
    facts: dict | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (kind, text)

    def problem(self, kind: str, text: str) -> None:
        self.problems.append((kind, text))


def _with_deadline(fn, seconds: float, *args):
    """``fn(*args)`` in a daemon thread; TimeoutError if it is not done in time (the thread is left)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn, *args).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        raise TimeoutError from None
    finally:
        pool.shutdown(wait=False)


def _addresses(name: str) -> list[str]:
    infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    return list(dict.fromkeys(i[4][0] for i in infos))


def _is_local(name: str, addresses: list[str]) -> bool:
    if name in ("localhost", socket.gethostname()) or any(a.startswith("127.") for a in addresses):
        return True
    for a in addresses:  # an address of this host can be bound; anyone else's cannot
        with socket.socket() as s:
            try:
                s.bind((a, 0))
                return True
            except OSError:
                pass
    return False


def ssh_command() -> list[str]:
    return shlex.split(os.environ.get("HYDRA_LAUNCHER_EXEC", "") or "ssh")


def _probe(report: HostReport, python: str, names: list[str], timeout: float) -> None:
    remote = [python, "-", *names]
    if report.local:
        cmd, report.ssh = remote, "local"
    else:
        connect = max(1, int(timeout / 2))
        options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect}"]
        cmd = [*ssh_command(), *options, report.name, shlex.join(remote)]
    try:
        done = subprocess.run(cmd, input=PROBE.read_text(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        report.ssh = "timeout"
        how = "the probe" if report.local else f"ssh {report.name}"
        report.problem("ssh", f"{report.name} did not answer within {timeout:g} s ({how} hung)")
        return
    except OSError as e:
        report.ssh = "no ssh"
        report.problem("ssh", f"cannot run {cmd[0]!r}: {e.strerror}")
        return
    why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    if done.returncode == 255 and not report.local:
        report.ssh = "failed"
        test = f"ssh -o BatchMode=yes {report.name} true"
        report.problem("ssh", f"ssh to {report.name} failed: {why} (test with: {test})")
        return
    if not report.local:
        report.ssh = "ok"
    if done.returncode in (126, 127):
        report.problem(
            "software",
            f"{python} not found on {report.name}: every host needs the same venv path (or a shared filesystem)",
        )
        return
    try:
        report.facts = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report.problem("software", f"the probe failed on {report.name}: {why}")


def check_host(name: str, python: str, names: list[str], timeout: float) -> HostReport:
    report = HostReport(name)
    try:
        addresses = _with_deadline(_addresses, min(3.0, timeout), name)
    except TimeoutError:
        report.problem("resolve", f"{name}: name lookup took over {min(3.0, timeout):g} s (DNS unreachable?)")
        return report
    except OSError as e:
        report.problem("resolve", f"{name} does not resolve here ({e.strerror}): add it to /etc/hosts or DNS")
        return report
    report.address = addresses[0]
    report.local = _is_local(name, addresses)
    _probe(report, python, names, timeout)
    return report


def compare(reports: list[HostReport], launcher: HostReport) -> None:
    """Add to each report what differs from the launcher or cannot work between hosts."""
    ref = launcher.facts or {}
    for r in reports:
        f = r.facts
        if f is None:
            continue
        if f.get("mpi") is None:
            r.problem("software", f"mpi4py does not load on {r.name}: {f.get('mpi_error')}")
        if _vendor(f.get("mpi")) != _vendor(ref.get("mpi")) and None not in (f.get("mpi"), ref.get("mpi")):
            # Different MPIs speak different wire protocols and launchers: no job spans them.
            r.problem(
                "software",
                f"a mix of MPIs: {r.name} runs {_vendor(f.get('mpi'))}, the launcher {_vendor(ref.get('mpi'))}; "
                "one job needs the same MPI on every host (make venv MPI=... alike everywhere)",
            )
        for key, label in (
            ("python", "python"),
            ("mpi4py", "mpi4py"),
            ("mpi", "MPI library"),
            ("torch", "torch"),
            ("mpi_sgd", "mpi-sgd"),
        ):
            if f.get(key) != ref.get(key):
                r.problem(
                    "software",
                    f"{r.name} has {label} {f.get(key)}, the launcher {ref.get(key)}: install the "
                    "same on every host (the same venv path or a shared filesystem)",
                )
        for peer, seen in f.get("peers", {}).items():
            if peer in (r.name, f.get("hostname")):
                continue
            if seen["address"] is None:
                r.problem(
                    "network", f"{r.name} cannot resolve {peer}: every host must resolve every other (and the launcher)"
                )
            elif seen["address"].startswith("127."):
                r.problem(
                    "network",
                    f"{r.name} resolves {peer} to {seen['address']} (loopback): fix /etc/hosts on "
                    f"{r.name} so {peer} maps to an address the others can reach",
                )
            elif str(seen["dev"]).startswith(LOCAL_BRIDGES):
                r.problem(
                    "network",
                    f"{r.name} would reach {peer} through {seen['dev']} (a local bridge): pin the "
                    "interface (docs/use/multi-host.md: choosing the network interface)",
                )
        if f.get("shm_bytes", 0) < SHM_MIN:
            r.problem(
                "shm",
                f"{r.name}: /dev/shm is {f.get('shm_bytes', 0) >> 20} MiB; MPI's shared memory needs "
                f"at least {SHM_MIN >> 20} MiB (Docker: --shm-size=1g, compose: shm_size)",
            )


def _vendor(library: str | None) -> str | None:
    """'MPICH', 'Open MPI', 'Intel MPI' or the library's own first words, from probe.mpi_library()."""
    if library is None:
        return None
    for vendor in ("MPICH", "Open MPI", "Intel"):
        if library.startswith(vendor):
            return "Intel MPI" if vendor == "Intel" else vendor
    return library.split(" v")[0]


def _routes(r: HostReport) -> str:
    if not r.facts:
        return "-"
    peers = r.facts.get("peers", {})
    devs = sorted({p["dev"] or "?" for n, p in peers.items() if n not in (r.name, r.facts.get("hostname"))})
    return ",".join(devs) or "-"


def table(reports: list[HostReport]) -> str:
    headers = ("host", "address", "ssh", "python", "mpi4py", "MPI", "torch", "to others via", "/dev/shm", "status")
    rows = [headers]
    for r in reports:
        f = r.facts or {}
        shm = f"{f['shm_bytes'] >> 20} MiB" if "shm_bytes" in f else "-"
        status = "ok" if not r.problems else "FIX"
        rows.append(
            (
                r.name,
                r.address,
                r.ssh,
                f.get("python", "-"),
                f.get("mpi4py") or "-",
                f.get("mpi") or "-",
                f.get("torch") or "-",
                _routes(r),
                shm,
                status,
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(headers))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def first_problem(reports: list[HostReport]) -> str | None:
    found = [(KINDS.index(kind), i, text) for i, r in enumerate(reports) for kind, text in r.problems]
    return min(found)[2] if found else None


def run(names: list[str], python: str, timeout: float) -> tuple[list[HostReport], HostReport]:
    launcher_name = socket.gethostname()
    reach = list(dict.fromkeys([*names, launcher_name]))
    with concurrent.futures.ThreadPoolExecutor(len(names) + 1) as pool:
        launcher_job = pool.submit(check_host, launcher_name, python, reach, timeout)
        jobs = [pool.submit(check_host, n, python, reach, timeout) for n in names]
        launcher, reports = launcher_job.result(), [j.result() for j in jobs]
    launcher.name = f"{launcher_name} (launcher)"
    compare(reports, launcher)
    return reports, launcher


def main(args: Flags) -> int:
    if args.clean:
        from . import residue

        residue.report_clean(grace=args.timeout)
        return 0
    try:
        hosts = parse_hosts_option(args.hosts) if args.hosts else read_hostfile(args.hostfile) if args.hostfile else []
    except ValueError as e:
        raise UsageError(str(e)) from None
    names = unique_names(hosts) or [socket.gethostname()]
    start = time.monotonic()
    reports, launcher = run(names, args.python, args.timeout)
    print(table([launcher, *reports]))
    for r in reports:
        for _, text in r.problems:
            print(f"  - {text}")
    problem = first_problem(reports)
    took = time.monotonic() - start
    if problem:
        print(f"not ready ({took:.1f} s). First thing to fix: {problem}")
        return 1
    print(f"ready: {len(names)} host(s) answer, match the launcher and can reach each other ({took:.1f} s)")
    return 0


@dataclass(frozen=True)
class Flags:
    hosts: str | None = flag(
        None, "comma-separated hosts as given to mpiexec -hosts (a,b or a:2,b:2)", names=("-hosts",)
    )
    hostfile: str | None = flag(
        None,
        "a hostfile as given to mpiexec: hydra (host:N) or Open MPI (host slots=N)",
        names=("-f", "-hostfile", "-machinefile"),
    )
    timeout: float = flag(10.0, "seconds each host gets to answer", positive_float)
    python: str = flag(sys.executable, "the python every host must have at the same path")
    clean: bool = flag(
        False,
        "remove the MPI segments in this host's /dev/shm that no process maps, older than --timeout seconds, "
        "and the session directories of Open MPI launchers that are gone",
    )

    def __post_init__(self):
        if self.hosts and self.hostfile:
            raise ValueError("give --hosts or --hostfile, not both")


def add_parser(subparsers) -> None:
    add_command(
        subparsers,
        "doctor",
        Flags,
        main,
        help="check the hosts of a multi-host run before starting it",
        description=__doc__,
    )
