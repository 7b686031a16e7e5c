"""What launchers say and do, read the same way for hydra (MPICH, Intel MPI) and Open MPI's prterun.

The start line that maps each rank to its process, the launcher's report of a rank that died,
matched back to that rank (:func:`explain_death`), which launcher an ``mpiexec`` is, and the signal
it passes on to its ranks for a graceful stop (:func:`stop_signal`); :func:`signal_and_wait`
sends one to a running job and times how long the job takes to end; :func:`failed_to_start` tells
a launcher that failed before any rank existed from a job that failed.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

# Open MPI 5's launcher now and then fails to start its own PMIx server ("The PMIx server's
# listener thread failed to start"; seen in CI here under load, and in other projects' CI) before
# any rank exists. That is the launcher's failure, not the job's: whoever starts jobs to judge them
# (the tests, the fault matrix) starts such a job once more, saying so.
LAUNCHER_FAILED_TO_START = ("The PMIx server's listener thread failed to start",)


def failed_to_start(status: int, stdout: str, stderr: str) -> bool:
    """Whether a job that exited ``status`` never started: its launcher failed before any rank ran."""
    return status != 0 and not stdout.strip() and any(m in stderr for m in LAUNCHER_FAILED_TO_START)


def run_job(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)``, started once more (saying
    so, naming ``what``) when its launcher :func:`failed_to_start`. ``stderr=subprocess.STDOUT``
    merges the streams, as a terminal shows them; the launcher's message is then looked for there."""
    opts = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **kwargs}
    for attempt in (1, 2):
        done = subprocess.run(cmd, **opts)
        merged = done.stderr is None
        out, err = ("", done.stdout) if merged else (done.stdout, done.stderr)
        if attempt == 2 or not failed_to_start(done.returncode, out, err):
            return done
        print(f"{what}: the launcher failed to start, no rank ran; once more", file=sys.stderr)


# -- naming the rank of a process the launcher reports dead -------------------------------------
# A rank killed by a signal (the OOM killer, a lost node) says nothing; the launcher names only its
# process ID, and kills the other ranks before they can speak (hydra: "PID 4242 RUNNING AT b" then
# "EXIT CODE: 9"). So the trainer's rank 0 prints, once at start, which process each rank is.
PROCESSES = "processes:"


def process_id() -> str:
    """This process as a launcher names it: ``PID@HOST``."""
    return f"{os.getpid()}@{socket.gethostname()}"


def processes_line(processes: list[str]) -> str:
    """The start line: ``processes: rank 0 = pid 41 on a, rank 1 = pid 7 on b`` from ``PID@HOST`` by rank."""
    parts = (f"rank {r} = pid {p.partition('@')[0]} on {p.partition('@')[2]}" for r, p in enumerate(processes))
    return f"{PROCESSES} {', '.join(parts)}"


def explain_death(output: str) -> str | None:
    """``rank 1 (pid 7 on b) killed by signal 9`` from a job's output: hydra's report of the process
    that ended the job, matched to its rank through :func:`processes_line`'s line. None unless both
    are there. (Hydra says "PID 7 RUNNING AT b", "EXIT CODE: 9" and, for a signal, "EXIT STRING:
    Killed (signal 9)"; Open MPI says "process rank 1 with PID 7 on node b exited on signal 9".)"""
    ompi = re.search(r"process rank (\d+) with PID (\d+) on node (\S+) exited on\s+signal (\d+)", output)
    if ompi:  # Open MPI's prterun names the rank itself
        return "rank {} (pid {} on {}) killed by signal {}".format(*ompi.groups())
    intel = _intel_ends(output)
    if intel:
        return intel
    line = re.search(rf"^{re.escape(PROCESSES)} (.*)$", output, re.M)
    if not line:
        return None
    by_pid = {pid: rank for rank, pid in re.findall(r"rank (\d+) = pid (\d+) on ", line.group(1))}
    # One block per process hydra saw end badly. A killed rank's peers may end too (a gloo peer
    # sees its connection close and aborts), so the block of the killed one is chosen, not the first.
    dead = [
        (pid, host, code)
        for pid, host, code in re.findall(r"PID (\d+) RUNNING AT (\S+)\s*\n=?\s*EXIT CODE: (\d+)", output)
        if pid in by_pid
    ] or [(pid, host, None) for pid, host in re.findall(r"PID (\d+) RUNNING AT (\S+)", output) if pid in by_pid]
    if not dead:
        return None
    signal = re.search(r"EXIT STRING: .*\(signal (\d+)\)", output)
    killed = [d for d in dead if signal and d[2] == signal.group(1)]
    pid, host, code = (killed or dead)[0]
    by_signal = killed or (signal and code is None)
    how = f"killed by signal {signal.group(1)}" if by_signal else f"exited with status {code or '?'}"
    return f"rank {by_pid[pid]} (pid {pid} on {host}) {how}"


def _intel_ends(output: str) -> str | None:
    """Intel MPI's hydra names the rank, but reports every rank it saw end, each as "RANK 1 PID 7
    RUNNING AT b" then "KILLED BY SIGNAL: 9 (Killed)" or "EXIT CODE: 3", in rank order, and ends
    the survivors with the same SIGKILL a dead rank may have died of: with more than one report the
    first to fail cannot be told, and the line says so rather than guess."""
    ends = re.findall(r"RANK (\d+) PID (\d+) RUNNING AT (\S+)\s*\n=?\s*(KILLED BY SIGNAL|EXIT CODE): (\d+)", output)
    if not ends:
        return None
    how = {"KILLED BY SIGNAL": "killed by signal", "EXIT CODE": "exited with status"}
    if len(ends) == 1:
        rank, pid, host, kind, code = ends[0]
        return f"rank {rank} (pid {pid} on {host}) {how[kind]} {code}"
    ranks = " or ".join(f"rank {rank}" for rank, *_ in ends)
    each = "; ".join(f"pid {pid} on {host} {how[kind]} {code}" for _, pid, host, kind, code in ends)
    return (
        f"{ranks} ended the job ({each}); Intel MPI's launcher reports every rank it ended, "
        "so which failed first cannot be told"
    )


def _version_text(mpiexec: str) -> str:
    """What ``mpiexec --version`` prints ("" where it cannot be run)."""
    try:
        return subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def launcher_family(mpiexec: str) -> str:
    """``hydra`` (MPICH, Intel MPI), ``openmpi`` or ``other``: what ``mpiexec --version`` says."""
    said = _version_text(mpiexec)
    # Open MPI 5's prterun says "(Open MPI) 5.0.x"; Open MPI 4's orterun says "(OpenRTE) 4.1.x".
    return "hydra" if "HYDRA" in said else "openmpi" if re.search(r"Open MPI|OpenRTE", said) else "other"


def hydra_version(mpiexec: str) -> tuple[int, int] | None:
    """(major, minor) of an MPICH launcher (Hydra's version is its MPICH's), else None."""
    found = re.search(r"HYDRA build details:\s*\n\s*Version:\s*(\d+)\.(\d+)", _version_text(mpiexec))
    return (int(found.group(1)), int(found.group(2))) if found else None


def statuses_after_signal(mpiexec: str, ranks_status: int) -> set[int]:
    """The statuses ``mpiexec`` may exit with when its ranks, stopped by a signal it passed on, exit
    with ``ranks_status``: theirs; under Hydra 4.0 (Debian 12's MPICH 4.0.2) also 0, as it exits
    before it has read its ranks' statuses in some runs (seen both ways, by the same test)."""
    version = hydra_version(mpiexec)
    return {0, ranks_status} if version and version[0] < 5 else {ranks_status}


def stop_signal(mpiexec: str) -> signal.Signals:
    """The signal that asks a job started by ``mpiexec`` to save and stop: hydra passes SIGTERM on
    to its ranks; Open MPI's launcher answers SIGTERM by killing them at once and passes SIGUSR1 on."""
    return signal.SIGUSR1 if launcher_family(mpiexec) == "openmpi" else signal.SIGTERM


def signal_and_wait(job: subprocess.Popen, signum: int, timeout: float) -> tuple[str, str, float] | None:
    """Send ``signum`` to ``job`` and wait for it to end: its stdout, its stderr and the seconds
    taken; None (the job killed) if it was still running after ``timeout`` seconds."""
    start = time.perf_counter()
    job.send_signal(signum)
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
        return None
    return out or "", err or "", time.perf_counter() - start


WIDTH = 120  # a terminal's line: what a benchmark echoes fits in it; the whole command is in its JSON


def short_command(cmd: list[str], env: Mapping[str, str] | None = None, width: int = WIDTH) -> str:
    """``$ VAR=1 mpiexec -n 2 python -m mpi_sgd.cli ...`` as one terminal line: programs by name, paths
    under the working directory relative to it, and cut at ``width`` with an ellipsis."""
    here = os.getcwd() + os.sep

    def short(word: str) -> str:
        if os.path.isabs(word) and os.path.exists(word):
            return word.removeprefix(here) if word.startswith(here) else os.path.basename(word)
        return word

    prefix = "".join(f"{k}={v} " for k, v in (env or {}).items())
    line = f"$ {prefix}{' '.join(short(w) for w in cmd)}"
    return line if len(line) <= width else line[: width - 2] + " …"
