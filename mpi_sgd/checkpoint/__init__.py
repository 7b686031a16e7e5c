"""Checkpoints that are never half-written, verified before use, and loaded without running pickled code.

Writing (:mod:`.store`): a checkpoint is a directory renamed into place whole, with a ``latest``
pointer replaced atomically after it, and a sha256 of its contents stored beside them.

Reading (:mod:`.payload`, :func:`load`): the root rank finds the checkpoint (``--resume auto``: the
newest one that verifies, passing over corrupt ones with a warning), checks its size and checksum,
and broadcasts its bytes to every rank as a ``uint8`` tensor: no pickle travels, and the other
ranks need not see the same filesystem. Every rank then reads the bytes with
``torch.load(weights_only=True)``, which accepts tensors and plain containers only. A checkpoint
that cannot be used raises :class:`CheckpointError` with one line, on every rank alike.

The trainer's own state, saved and resumed: :mod:`.trainer_state`. One job per directory:
:mod:`.lock`.
"""

from __future__ import annotations

from .lock import hold
from .paths import check_writable
from .payload import deserialize, load, read, read_state, serialize
from .store import CheckpointError, checkpoints, save, step_name
from .trainer_state import TRAINER_KEYS, Progress, restore, resume, save_training

__all__ = [
    "CheckpointError",
    "Progress",
    "TRAINER_KEYS",
    "check_writable",
    "checkpoints",
    "deserialize",
    "hold",
    "load",
    "read",
    "read_state",
    "restore",
    "resume",
    "save",
    "save_training",
    "serialize",
    "step_name",
]
