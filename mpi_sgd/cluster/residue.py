"""What a killed MPI job leaves in /dev/shm and the temporary directory, and clearing it.

The ranks of a node talk through files in /dev/shm that their MPI names there: MPICH's start-up
segment ``mpich_shm_*`` (``mpich_shar_tmp*`` from MPICH 4.0), Open MPI 5's
``sm_segment.HOST.UID.JOB.RANK`` (Open MPI 4's ``vader_segment.*``), Intel MPI's ``Intel_MPI_*``.
A job that finalizes removes them; one killed (SIGKILL, an out-of-memory kill, a node's job
cleanup that only signals) cannot, and the files stay, in memory, until the machine reboots: 16
MiB per rank for Open MPI, a few MiB per node for MPICH, job after job.

Two defences. A job of this project unlinks MPICH's segment as soon as every rank of the node has
it mapped (:func:`mpi_sgd.comm.shm.window.unlink_mpi_segments`), so a kill leaves no name behind.
Intel MPI unlinks its own once its ranks map them, so only a job killed in between (one hung in
``MPI_Win_allocate_shared``, say) leaves one. Open MPI's cannot be unlinked early (its ranks open
them by name while they connect), so the next job's first rank on the node, or ``mpi-sgd doctor
--clean``, removes the segments whose creators are gone, and only those: files of this user (any
user's, as root) that no process maps, older than :data:`GRACE_S` (a job that is starting creates
its segment and maps it in the same breath).

Open MPI's launcher (PRRTE's ``prterun``) also keeps a session directory, ``TMPDIR/ompi.PID``
(PMIx rendezvous files, hwloc's topology), which a killed launcher leaves behind too. That one
does harm beyond the space: a later launcher that gets the same pid (pids wrap at ``pid_max``,
32768 on many systems, within a few thousand jobs) cannot start its PMIx server there and fails
before any rank runs ("The PMIx server's listener thread failed to start", exit 213). So the same
cleaners remove the session directories whose launcher is gone (:func:`stale_sessions`). Both
judge liveness by what this host's /proc shows: a job in another PID namespace that shares this
/dev/shm or temporary directory would look dead from here.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

PATTERNS = ("mpich_shm_*", "mpich_shar_tmp*", "sm_segment.*", "vader_segment.*", "Intel_MPI_*")
GRACE_S = 60.0
SHM = "/dev/shm"


def segments(directory: str = SHM) -> list[Path]:
    """The MPI segments in ``directory`` this process may remove: its user's (every one, as root)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    me = os.geteuid()
    found = []
    for name in names:
        if any(fnmatch.fnmatchcase(name, p) for p in PATTERNS):
            path = Path(directory) / name
            try:
                if me == 0 or path.stat().st_uid == me:
                    found.append(path)
            except OSError:
                continue  # gone meanwhile
    return found


def mapped_inodes(proc: str = "/proc") -> set[int]:
    """The inodes of every file some process maps (of the processes this user may read)."""
    inodes = set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(f"{proc}/{pid}/maps") as f:
                for line in f:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[4] != "0":
                        inodes.add(int(fields[4]))
        except OSError:
            continue  # exited meanwhile, or another user's
    return inodes


def orphans(directory: str = SHM, now: float | None = None, grace: float = GRACE_S) -> list[Path]:
    """The segments in ``directory`` that no process maps and that are older than ``grace`` seconds."""
    candidates = []
    now = time.time() if now is None else now
    for path in segments(directory):
        try:
            st = path.stat()
        except OSError:
            continue
        if now - st.st_mtime > grace:
            candidates.append((path, st.st_ino))
    if not candidates:
        return []  # the common case: /proc is not read at all
    in_use = mapped_inodes()
    return [path for path, inode in candidates if inode not in in_use]


def clean(directory: str = SHM, grace: float = GRACE_S) -> list[tuple[str, int]]:
    """Remove :func:`orphans`; their names and sizes in bytes."""
    removed = []
    for path in orphans(directory, grace=grace):
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError:
            continue  # another cleaner was first, or it is not ours to remove after all
        removed.append((path.name, size))
    return removed


SESSION = re.compile(r"ompi\.(\d+)")  # Open MPI 5's launcher session, named by the launcher's pid
# A pid's process counts as the directory's owner if it started before the directory last changed;
# the slack covers the boot time's whole seconds. A reused pid starts minutes or days later.
SLACK_S = 2.0


def _start_time(pid: int, proc: str) -> float | None:
    """When process ``pid`` started (seconds since the epoch), or None if there is none."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # the name, in parentheses, may hold spaces
        with open(f"{proc}/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
    except FileNotFoundError:
        return None
    except (OSError, StopIteration, IndexError, ValueError):
        return 0.0  # there but unreadable: treated as the owner, never removed on a guess
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def sessions(directory: str | None = None) -> list[Path]:
    """Every Open MPI launcher session directory in ``directory`` (the temporary directory, as the
    launcher picks it: TMPDIR, else /tmp), live or not; this user's only (any user's, as root)."""
    base = Path(directory or tempfile.gettempdir())
    try:
        names = os.listdir(base)
    except OSError:
        return []
    me, found = os.geteuid(), []
    for name in filter(SESSION.fullmatch, names):
        path = base / name
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and (me == 0 or st.st_uid == me):
            found.append(path)
    return found


def stale_sessions(directory: str | None = None, proc: str = "/proc") -> list[Path]:
    """The :func:`sessions` whose launcher is gone: no process has its pid, or the one that has it
    started after the directory last changed (the pid was reused)."""
    found = []
    for path in sessions(directory):
        try:
            changed = path.lstat().st_mtime
        except OSError:
            continue
        started = _start_time(int(SESSION.fullmatch(path.name)[1]), proc)
        if started is None or started > changed + SLACK_S:
            found.append(path)
    return found


def clean_sessions(directory: str | None = None) -> list[str]:
    """Remove :func:`stale_sessions`; their paths."""
    removed = []
    for path in stale_sessions(directory):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(str(path))
    return removed


def report_clean(grace: float = GRACE_S) -> None:
    """``mpi-sgd doctor --clean``: :func:`clean` and :func:`clean_sessions`, each removal named."""
    removed = clean(grace=grace)
    for name, size in removed:
        print(f"removed {SHM}/{name} ({size / 2**20:.1f} MiB): no process maps it")
    print(f"{len(removed)} segment(s) of ended jobs removed, {sum(s for _, s in removed) / 2**20:.1f} MiB freed")
    for path in clean_sessions():
        print(f"removed {path}: the session directory of an Open MPI launcher that is gone")
