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
    timeout, where = _given_or_env(timeout, "MPI_SGD_SHM_TIMEOUT", float, "a number of seconds", environ)
    if timeout is None:
        return DEFAULT_TIMEOUT
    if not 0 < timeout < math.inf:  # NaN too
        raise ValueError(
            f"{where or 'the shared-memory wait timeout'} must be above 0 seconds (and finite), got {timeout}"
        )
    return timeout


def node_size_override(node_size: int | None = None, environ: Mapping[str, str] | None = None) -> int | None:
    """``node_size`` if given, else ``MPI_SGD_SHM_NODE_SIZE`` if set: ranks per pretend node (tests)."""
    node_size, where = _given_or_env(node_size, "MPI_SGD_SHM_NODE_SIZE", int, "a whole number of ranks", environ)
    if node_size is not None and node_size < 1:
        raise ValueError(f"{where or 'node size'} must be at least 1 rank, got {node_size}")
    return node_size


def _given_or_env(value, name: str, parse, what: str, environ: Mapping[str, str] | None):
    """``(value, None)`` if given, else the variable ``name`` parsed, and its name (for messages)."""
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if value is not None or not text:
        return value, None
    try:
        return parse(text), name
    except ValueError:
        raise ValueError(f"{name} must be {what}, got {text!r}") from None
