"""What a killed MPI job leaves in /dev/shm, and clearing it.

The ranks of a node talk through files in /dev/shm that their MPI names there: MPICH's start-up
segment ``mpich_shm_*``, Open MPI 5's ``sm_segment.HOST.UID.JOB.RANK`` (Open MPI 4's
``vader_segment.*``). A job that finalizes removes them; one killed (SIGKILL, an out-of-memory
kill, a node's job cleanup that only signals) cannot, and the files stay, in memory, until the
machine reboots: 16 MiB per rank for Open MPI, a few MiB per node for MPICH, job after job.

Two defences. A job of this project unlinks MPICH's segment as soon as every rank of the node has
it mapped (:func:`mpi_sgd.comm.shm.window.unlink_mpi_segments`), so a kill leaves no name behind.
Open MPI's cannot be unlinked early (its ranks open them by name while they connect), so the next
job's first rank on the node, or ``mpi-sgd doctor --clean``, removes the segments whose creators
are gone, and only those: files of this user (any user's, as root) that no process maps, older
than :data:`GRACE_S` (a job that is starting creates its segment and maps it in the same breath).
"""

from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path

PATTERNS = ("mpich_shm_*", "sm_segment.*", "vader_segment.*")
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
