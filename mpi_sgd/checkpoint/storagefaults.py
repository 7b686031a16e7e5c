"""``MPI_SGD_SAVE_FAULT``: storage that misbehaves on purpose, for the tests and the fault matrix.

``slow:SECONDS`` makes each save sleep that long before it writes (a slow or hung file system),
``slow-read:SECONDS`` each read of a checkpoint, and ``full`` makes each save fail as a full disk
does, after writing half its state. :mod:`.store` calls the hooks; unset, they do nothing.
"""

from __future__ import annotations

import errno
import math
import os
import time

SAVE_FAULT = "MPI_SGD_SAVE_FAULT"


def save_fault() -> tuple[str, float] | None:
    """The variable's fault: ``(kind, seconds)``; None when unset; ValueError, one line, when bad."""
    text = os.environ.get(SAVE_FAULT, "").strip()
    if not text:
        return None
    kind, _, arg = text.partition(":")
    if kind == "full" and not arg:
        return "full", 0.0
    if kind in ("slow", "slow-read"):
        try:
            seconds = float(arg)
        except ValueError:
            seconds = -1.0
        if 0 <= seconds < math.inf:  # (time.sleep cannot take inf)
            return kind, seconds
    raise ValueError(f"{SAVE_FAULT}={text!r}: expected slow:SECONDS (e.g. slow:30), slow-read:SECONDS or full")


def injected_save_fault(tmp: str, state_name: str, size: int) -> None:
    """Before a save writes into the directory ``tmp``: sleep, or fail as a full disk would."""
    fault = save_fault()
    if fault is None:
        return
    kind, seconds = fault
    if kind == "slow":
        time.sleep(seconds)
    if kind != "full":
        return
    os.mkdir(tmp)
    with open(os.path.join(tmp, state_name), "wb") as f:
        f.write(b"\0" * (size // 2))  # what a disk filling up mid-write leaves
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), state_name)


def injected_read_delay() -> None:
    """Before a checkpoint is read: ``slow-read:SECONDS`` sleeps that long."""
    fault = save_fault()
    if fault is not None and fault[0] == "slow-read":
        time.sleep(fault[1])
