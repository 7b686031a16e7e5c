"""Checkpoints that are never half-written, and that load without running pickled code.

Writing: the root rank saves to a temporary file in the target's directory, flushes and fsyncs
it, then ``os.replace``\\ s it over the target (atomic on POSIX within one filesystem) and fsyncs
the directory so the rename itself survives a crash. A reader sees the old checkpoint or the
new one, never a mixture; a job killed mid-write leaves at most a stray temporary file.

Reading: ``torch.load(weights_only=True)`` accepts tensors and plain containers only. The root
reads the file and broadcasts its contents, so the other ranks need not see the same filesystem.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import torch


def save_atomic(obj, path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path: str, comm, root: int = 0):
    """The checkpoint at ``path`` on every rank, read once by ``root``."""
    state = torch.load(path, weights_only=True) if comm.rank == root else None
    return comm.bcast_obj(state, root)
