"""The shared-memory all-reduce's two environment settings, read without MPI.

Kept apart from :mod:`.sync` and :mod:`.window` (which import ``mpi4py.MPI``, and so start MPI) so
that every rank can check them before MPI starts (:func:`mpi_sgd.comm.check_environment`), as the
flags are checked: a bad value is one line and exit status 2, not a traceback from every rank.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

DEFAULT_TIMEOUT = 300.0  # seconds a rank waits for the others in the shared segment


def timeout_setting(timeout: float | None = None, environ: Mapping[str, str] | None = None) -> float:
    """``timeout`` if given, else ``MPI_SGD_SHM_TIMEOUT`` if set, else the default: seconds, above 0."""
    text = (os.environ if environ is None else environ).get("MPI_SGD_SHM_TIMEOUT", "").strip()
    where = "the shared-memory wait timeout"
    if timeout is None and text:
        where = "MPI_SGD_SHM_TIMEOUT"
        try:
            timeout = float(text)
        except ValueError:
            raise ValueError(f"MPI_SGD_SHM_TIMEOUT must be a number of seconds, got {text!r}") from None
    if timeout is None:
        return DEFAULT_TIMEOUT
    if not 0 < timeout < math.inf:  # NaN too
        raise ValueError(f"{where} must be above 0 seconds (and finite), got {timeout}")
    return timeout


def node_size_override(node_size: int | None = None, environ: Mapping[str, str] | None = None) -> int | None:
    """``node_size`` if given, else ``MPI_SGD_SHM_NODE_SIZE`` if set: ranks per pretend node (tests)."""
    text = (os.environ if environ is None else environ).get("MPI_SGD_SHM_NODE_SIZE", "").strip()
    where = "node size"
    if node_size is None and text:
        where = "MPI_SGD_SHM_NODE_SIZE"
        try:
            node_size = int(text)
        except ValueError:
            raise ValueError(f"MPI_SGD_SHM_NODE_SIZE must be a whole number of ranks, got {text!r}") from None
    if node_size is not None and node_size < 1:
        raise ValueError(f"{where} must be at least 1 rank, got {node_size}")
    return node_size
