"""scikit-learn's 8x8 digits, kept in a small cache file so that a rank need not import scikit-learn.

Importing ``sklearn.datasets`` pulls in scipy and costs a process about as much CPU as importing
torch itself, and every rank of every job on the default dataset paid it (on a host with fewer
cores than ranks, R times over before the first step; the measured cost is on the contributors'
Tests page). The arrays themselves are 1,797 images of 8x8 integers 0..16 and their labels.

So the first load goes through scikit-learn and writes the arrays to
``<cache>/digits-scikit-learn-<version>.npz``; later loads read that file back in milliseconds.
The file is named by the installed scikit-learn's version (read from its metadata, without
importing it), so upgrading scikit-learn starts a new file, and uninstalling it gives the same
``ImportError`` as before (:func:`mpi_sgd.data.load` then falls back to synthetic blobs). The cache
is only ever a copy: a file that is missing, unreadable or not of the expected shape is ignored and
written afresh, and a cache directory that cannot be written costs only the speed. Ranks that load
at the same moment each write a temporary file and rename it into place (atomic, also on NFS), so a
reader never sees half a file.

``<cache>`` is ``MPI_SGD_CACHE`` if set, else ``$XDG_CACHE_HOME/mpi-sgd``, else ``~/.cache/mpi-sgd``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import tempfile

import numpy as np

DIGITS_SHAPE = (1797, 8, 8)


def cache_dir() -> str | None:
    """Where cache files go; None where there is no such place (no HOME, as for some daemons)."""
    if os.environ.get("MPI_SGD_CACHE"):
        return os.environ["MPI_SGD_CACHE"]
    if os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "mpi-sgd")
    home = os.path.expanduser("~")
    return None if home.startswith("~") else os.path.join(home, ".cache", "mpi-sgd")


def digits_path() -> str | None:
    """The cache file for the installed scikit-learn (None: no cache directory); ImportError when
    scikit-learn is not installed."""
    try:
        version = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError("scikit-learn is not installed") from None
    folder = cache_dir()
    return None if folder is None else os.path.join(folder, f"digits-scikit-learn-{version}.npz")


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)``: uint8 of shape (1797, 8, 8) holding 0..16, and int64 class indices."""
    path = digits_path()
    cached = None if path is None else _read(path)
    if cached is not None:
        return cached
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images, labels = bunch.images.astype(np.uint8), bunch.target.astype(np.int64)
    if not np.array_equal(images, bunch.images):  # the values are whole numbers 0..16: uint8 holds them exactly
        raise ValueError("scikit-learn's digits are no longer whole numbers 0..16; mpi_sgd.datacache needs updating")
    if path is not None:
        _write(path, images, labels)
    return images, labels


def _read(path: str) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as f:
            images, labels = f["images"], f["labels"]
    except Exception:  # missing, truncated, not a zip, other keys: it is only a copy
        return None
    if images.shape != DIGITS_SHAPE or images.dtype != np.uint8 or images.max() > 16:
        return None
    if labels.shape != DIGITS_SHAPE[:1] or labels.dtype != np.int64 or labels.min() < 0 or labels.max() > 9:
        return None
    return images, labels


def _write(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    folder = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".digits-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, images=images, labels=labels)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a shared MPI_SGD_CACHE serves every user
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass  # a read-only or full cache directory: the next load goes through scikit-learn again
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
