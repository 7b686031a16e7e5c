"""One job per checkpoint directory: an OS lock on a file in it, held for the job's life.

Two jobs given the same ``--checkpoint DIR`` would overwrite each other's checkpoints and leave
``latest`` naming one job's step while ``--resume auto`` picks the other's. So the root rank of a
job takes ``flock(LOCK_EX | LOCK_NB)`` on ``DIR/.lock`` before training and keeps the file open
until the process ends; the kernel releases it however the process ends (exit, exception,
SIGKILL), so a killed job never leaves a stale lock behind. The file says who holds it (host, pid,
start time), for the second job's one-line refusal.

On NFS, Linux implements ``flock`` with the server's byte-range locks (NFSv4, or v3 with lockd), so
two jobs on two hosts exclude each other too. A file system that offers no locks at all (an NFSv3
mount with ``nolock``) answers ENOLCK: the job then goes on with one warning line that two jobs
there would not be kept apart.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import sys
import time

from .store import LOCK, CheckpointError

_held: dict[str, object] = {}  # directory -> its open lock file: the lock lives as long as the file is open


def acquire(directory: str) -> str | None:
    """Take the lock of ``directory`` for this process (again: a no-op); the refusal's text if another holds it."""
    key = os.path.realpath(directory)
    if key in _held:
        return None
    try:  # a directory that cannot be written is refused now, not when the first save fails
        probe(directory)
        f = open(os.path.join(directory, LOCK), "a+")  # noqa: SIM115 (open for the process's life: that is the lock)
    except OSError as e:
        return f"--checkpoint {directory!r} cannot be written: {e.strerror or e}"
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            f.seek(0)
            holder = f.read().strip() or "a process that has not said who it is"
            f.close()
            return (
                f"--checkpoint {directory!r} is in use by another job ({holder}); two jobs in one directory "
                "would overwrite each other's checkpoints: give this one another directory, or wait for that one"
            )
        f.close()
        print(
            f"warning: cannot lock {directory!r} ({e.strerror}): this file system keeps no locks, so a second "
            "job there would not be refused",
            file=sys.stderr,
            flush=True,
        )
        return None
    f.seek(0)
    f.truncate()
    f.write(f"host {socket.gethostname()}, pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    _held[key] = f
    return None


def probe(directory: str) -> None:
    """Make ``directory`` if needed, then write, fsync and remove a small file in it: OSError if any
    of that fails (a read-only mount, /proc, a full disk, no permission)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f".probe-{os.getpid()}")
    try:
        with open(path, "wb") as f:
            f.write(b"probe\n")
            f.flush()
            os.fsync(f.fileno())
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def hold(directory: str, comm, root: int = 0) -> None:
    """The root takes the lock; every rank raises the same :class:`CheckpointError` if another job holds it."""
    refusal = comm.bcast_obj(acquire(directory) if comm.rank == root else None, root)
    if refusal:
        raise CheckpointError(refusal)
