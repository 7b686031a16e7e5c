"""A checkpoint's payload: the state as bytes and back, read and verified on one rank, sent to all.

Every rank reads the bytes with ``torch.load(weights_only=True)``, which accepts tensors and plain
containers only: no pickled code runs, whoever wrote the file. The root reads and verifies them
(:mod:`.store`) and broadcasts them as a ``uint8`` tensor, so no pickle travels and the other ranks
need not see the same filesystem.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys

import torch

from . import deadline
from .storagefaults import injected_read_delay
from .store import CheckpointError, checkpoints, is_store, latest, newest_valid, read_verified


def serialize(state) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def deserialize(blob: bytes, path: str):
    """``torch.load(weights_only=True)`` of ``blob``, failing with one line that names ``path``.

    torch's own messages run to a dozen lines, and for a file holding other objects they advise
    turning ``weights_only`` off, which would run whatever code the file carries: never the fix
    for a checkpoint that this trainer, which writes tensors and plain containers only, did not write.
    """
    try:
        return torch.load(io.BytesIO(blob), weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported global" not in str(e):  # not a pickle at all (torch reports a bad opcode)
            raise CheckpointError(
                f"cannot read checkpoint {path!r}: not a torch checkpoint, or a truncated one"
            ) from None
        raise CheckpointError(
            f"checkpoint {path!r} holds objects other than tensors and plain containers, so it was not "
            "written by this trainer; it is not loaded, since unpickling them could run any code"
        ) from None
    except Exception:  # torch raises KeyError, EOFError, RuntimeError... for files that are not its own
        raise CheckpointError(f"cannot read checkpoint {path!r}: not a torch checkpoint, or a truncated one") from None


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {e.strerror or e}") from None


def read(path: str, auto: bool = False, warn=None) -> tuple[str, bytes, dict | None] | None:
    """``(checkpoint path, state bytes, meta)`` for ``path``, on this process only.

    ``path`` is a checkpoint directory (``--checkpoint DIR``: what ``latest`` names), one
    checkpoint in it (``DIR/step-N``), or a single file (no checksum, so ``meta`` is None). With
    ``auto``, corrupt checkpoints in ``DIR`` are passed over (``warn``) and None means none yet;
    ``DIR`` holding only unreadable ones raises, unless ``auto`` is ``"or-fresh"``.
    """
    warn = warn or (lambda text: print(text, file=sys.stderr, flush=True))
    injected_read_delay()
    if os.path.isdir(path) and is_store(path):
        if auto:
            return newest_valid(path, warn, fresh_ok=auto == "or-fresh")
        newest = latest(path) or next(iter(checkpoints(path)), None)
        if newest is None:
            raise CheckpointError(f"cannot read checkpoint {path!r}: the directory holds no checkpoint")
        return (newest, *read_verified(newest))
    if os.path.isdir(path):
        return (path, *read_verified(path))
    if auto and not os.path.exists(path):
        return None
    return path, _read_file(path), None


def read_state(path: str):
    """The state of the checkpoint at ``path`` (a ``--checkpoint`` directory: its newest), its
    checksum verified, on this process alone: for tests and tools that inspect a checkpoint."""
    where, blob, _ = read(path)
    return deserialize(blob, where)


def load(path: str, comm, root: int = 0, auto: bool = False, timeout: float = 600.0):
    """``(state, meta, checkpoint path)`` on every rank, read and verified by ``root``; None if
    ``auto`` found no checkpoint. Errors reach every rank alike (:class:`CheckpointError`).

    The read is a section with a deadline of its own (:mod:`.deadline`): the other ranks wait for
    it asleep, their watchdogs allow it ``timeout`` seconds (the trainer passes ``--save-timeout``,
    whose default this is; 0: no limit), and a read still going then is reported as hung, naming
    the path.
    """
    header = torch.zeros(4, dtype=torch.int64)  # status (0 none, 1 ok, 2 error), len(path), len(meta), len(state)

    def read_on_root() -> bytes:
        try:
            found = read(path, auto)
            if found is None:
                return b""
            where, blob, meta = found
            parts = [where.encode(), json.dumps(meta).encode(), blob]
            header[:] = torch.tensor([1, *map(len, parts)])
            return b"".join(parts)
        except (CheckpointError, OSError) as e:  # every failure becomes the same one line on every rank
            text = str(e) if isinstance(e, CheckpointError) else f"cannot read checkpoint {path!r}: {e}"
            header[:] = torch.tensor([2, len(text.encode()), 0, 0])
            return text.encode()

    what = f"reading checkpoint {path!r}"
    payload = deadline.run(comm, read_on_root, what, timeout, root, "read")  # None but on the root
    comm.broadcast(header, root)
    status, n_path, n_meta, n_state = header.tolist()
    if status == 0:
        return None
    data = torch.zeros(n_path + n_meta + n_state, dtype=torch.uint8)
    if comm.rank == root:
        data.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    if len(data):
        comm.broadcast(data, root)
    raw = data.numpy().tobytes()
    if status == 2:
        raise CheckpointError(raw.decode())
    where, meta_text, blob = raw[:n_path].decode(), raw[n_path : n_path + n_meta].decode(), raw[n_path + n_meta :]
    meta = json.loads(meta_text)  # null for a single file
    return deserialize(blob, where), meta, where
