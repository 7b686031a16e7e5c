"""What may be given as ``--checkpoint DIR`` and what in it belongs to the store.

Checked by every rank before MPI starts (:class:`mpi_sgd.config.TrainConfig`), without writing
anything, so that a path that cannot work fails in one line before the first step; the root's
probe write as it takes the lock (:mod:`.lock`) then tries the disk itself.
"""

from __future__ import annotations

import os

from .store import LATEST, LOCK, STEP_NAME, TEMP_PREFIX


def within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies in it (symbolic links resolved)."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory


def owns(directory: str, path: str) -> bool:
    """Whether ``path`` is, or lies in, something of the store ``directory`` that saves replace or
    remove (``latest``, the lock, a ``step-N``, a ``.tmp-*``): no other file may be written there."""
    directory, path = os.path.realpath(directory), os.path.realpath(path)
    if not within(path, directory) or path == directory:
        return False
    first = os.path.relpath(path, directory).split(os.sep)[0]
    return first in (LATEST, LOCK) or first.startswith(TEMP_PREFIX) or bool(STEP_NAME.match(first))


def check_writable(path: str) -> None:
    """Raise ValueError unless checkpoints can be written to ``path`` (a directory, made if needed).

    Checked without writing anything, so every rank can run it before MPI starts.
    """
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(f"--checkpoint {path!r} is a file; it names a directory that checkpoints are written into")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"--checkpoint {path!r}: the directory is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--checkpoint {path!r} cannot be created: {parent!r} is not a writable directory")
