"""Checkpoint directories that a kill at any moment leaves loadable.

Layout of ``--checkpoint DIR``::

    DIR/latest                the name of the newest complete checkpoint (one line)
    DIR/step-00000025/        one complete checkpoint
        state.pt              model, optimizer, counters, RNG states: tensors and plain containers
        meta.json             format, sha256 and size of state.pt, step, epoch, world size, config
    DIR/.tmp-*                a save in progress, or one a kill interrupted (removed by the next save)

A save writes everything into a fresh ``.tmp-*`` directory, fsyncs each file and the directory,
then renames it to ``step-N`` (atomic within a filesystem: the directory appears whole or not at
all), fsyncs ``DIR``, and only then replaces ``latest`` (a temporary file renamed over it, the
same way). A kill before the rename leaves a ``.tmp-*`` that no reader looks at; a kill after it
leaves a complete ``step-N``, with ``latest`` naming it or its predecessor. Either way the previous
checkpoint is untouched: older ones are removed (``keep``) only after ``latest`` has moved on.

"Newest" means most recently written, not highest step: a run resumed
from an earlier step into the same directory (a rollback after a divergence) writes lower steps
than the run it abandoned, and it is the new run's checkpoints that ``latest`` names, that
``--resume auto`` takes and that ``keep`` keeps; the abandoned ones go first. Writing a step that
is already there swaps the new copy in with one atomic exchange where the OS has one (Linux's
``renameat2``), so ``latest`` never names a missing directory; elsewhere (NFS) the old copy is
renamed aside first, and a kill between the two renames leaves ``latest`` naming nothing until
``--resume auto`` takes the newest copy that verifies.

The order of writing is a number, not a time: each save records in ``meta.json`` a ``seq`` one past
the highest in the directory (the directory's lock keeps a second job from racing it). Clocks
order badly: two hosts' clocks disagree, and a root rank that moves between hosts, or a clock set
back, would make an older checkpoint look newest, so that ``--resume auto`` took it and ``keep``
deleted the checkpoints written after it. Checkpoints from before ``seq`` order among themselves
by the time they recorded, after every checkpoint that has one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import time

from .storagefaults import injected_save_fault

FORMAT = 1
STATE, META, LATEST = "state.pt", "meta.json", "latest"
TEMP_PREFIX, LOCK = ".tmp-", ".lock"  # a save in progress; the job's lock (:mod:`.lock`)
STEP_NAME = re.compile(r"^step-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit; the message is the whole story."""


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: str, blob: bytes) -> None:
    with open(path, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())


def _temp_name(directory: str) -> str:
    # not tempfile.mkdtemp/mkstemp: those make private (0700/0600) entries; these follow the umask
    return os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")


def remove_stale(directory: str) -> list[str]:
    """Remove what interrupted saves left behind (``.tmp-*``); returns their names.

    Only the root rank of the one job writing ``directory`` saves into it, so anything temporary
    found before a save began belongs to a save that can no longer finish.
    """
    removed = []
    for name in os.listdir(directory):
        if name.startswith(TEMP_PREFIX):
            path = os.path.join(directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            removed.append(name)
    return removed


def save(blob: bytes, meta: dict, directory: str, step: int, keep: int = 0) -> str:
    """Write ``blob`` (a serialised state) and ``meta`` as checkpoint ``step`` of ``directory``.

    Returns the new checkpoint's path. ``meta`` gains the format, the size and the sha256 of
    ``blob``, which :func:`read_verified` checks before anything is unpickled. With ``keep > 0``,
    only the ``keep`` newest checkpoints remain afterwards.

    A write that fails (a full disk, a quota, an I/O error) raises :class:`CheckpointError` with one
    line naming the path and, for a full disk, the bytes the save needed; what it had written is
    removed, so the failure leaves the disk as full as before it and the previous checkpoint loads.
    """
    os.makedirs(directory, exist_ok=True)
    remove_stale(directory)
    meta = {"format": FORMAT, "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob), **meta}
    meta["seq"] = 1 + max((_order(p)[0] for _, p in _step_dirs(directory)), default=0)  # see the docstring
    meta["written"] = time.time()  # for people, and to order checkpoints saved before "seq"
    tmp = _temp_name(directory)
    meta_blob = json.dumps(meta, indent=1).encode()
    try:
        injected_save_fault(tmp, STATE, len(blob))
        os.mkdir(tmp)
        _write(os.path.join(tmp, STATE), blob)
        _write(os.path.join(tmp, META), meta_blob)
        _fsync_dir(tmp)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_write_failure(e, directory, step, len(blob) + len(meta_blob))) from None
    return _publish(tmp, directory, step, keep)


def _write_failure(e: OSError, directory: str, step: int, needed: int) -> str:
    where = f"saving step {step} to {directory!r}"
    kept = latest(directory)
    after = "; the partial files were removed" + (f", and {kept!r} still loads" if kept else "")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = shutil.disk_usage(directory).free
        except OSError:
            free = None
        room = f" ({free} bytes free)" if free is not None else ""
        return f"{where} failed: no space left on the device; the checkpoint needs {needed} bytes{room}{after}"
    return f"{where} failed: {e.strerror or e}{after}"


def _publish(tmp: str, directory: str, step: int, keep: int) -> str:
    """Rename the complete ``tmp`` to ``step-N``, point ``latest`` at it, drop the oldest beyond ``keep``."""
    name = step_name(step)
    final = os.path.join(directory, name)
    aside = None
    if not os.path.exists(final):
        os.rename(tmp, final)
    elif _exchange(tmp, final):  # the same step written again (a rollback's run): the old copy is now at tmp
        aside = tmp
    else:  # no atomic exchange here: the old copy aside, then the new one in (a window of two renames)
        aside = _temp_name(directory)
        os.rename(final, aside)
        os.rename(tmp, final)
    _fsync_dir(directory)
    pointer = _temp_name(directory)
    _write(pointer, (name + "\n").encode())
    os.replace(pointer, os.path.join(directory, LATEST))
    _fsync_dir(directory)
    if aside:
        shutil.rmtree(aside, ignore_errors=True)
    if keep > 0:
        for old in checkpoints(directory)[keep:]:
            if os.path.basename(old) != name:
                shutil.rmtree(old, ignore_errors=True)
    return final


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swap the paths ``a`` and ``b`` in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``);
    False where the C library or the file system has no such call (NFS, other systems)."""
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    return call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _order(path: str) -> tuple[int, float]:
    """``(seq, written)`` of the checkpoint at ``path``, the key of "newest": ``seq`` is -1 for a
    checkpoint saved before it was recorded; ``written`` is ``meta.json``'s record, else the file's
    mtime, else 0 (no readable ``meta.json``: sorted last)."""
    try:
        with open(os.path.join(path, META), "rb") as f:
            meta = json.loads(f.read())
        seq, when = meta.get("seq"), meta.get("written")
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else -1
        if isinstance(when, (int, float)):
            return seq, float(when)
        return seq, os.stat(os.path.join(path, META)).st_mtime
    except (OSError, ValueError, AttributeError):
        return -1, 0.0


def _step_dirs(directory: str) -> list[tuple[int, str]]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [(int(m.group(1)), os.path.join(directory, n)) for n in names if (m := STEP_NAME.match(n))]


def checkpoints(directory: str) -> list[str]:
    """The ``step-N`` directories in ``directory``, newest (most recently written) first; among
    checkpoints of the same order, the highest step first."""
    return [p for _, _, p in sorted(((_order(p), step, p) for step, p in _step_dirs(directory)), reverse=True)]


def latest(directory: str) -> str | None:
    """The checkpoint ``latest`` names, or None if there is no such pointer."""
    try:
        with open(os.path.join(directory, LATEST)) as f:
            name = f.read().strip()
    except OSError:
        return None
    return os.path.join(directory, name) if STEP_NAME.match(name) else None


def is_store(path: str) -> bool:
    """Whether ``path`` is a checkpoint directory (holding ``latest`` or ``step-N``), not one checkpoint."""
    return os.path.isdir(path) and not os.path.isfile(os.path.join(path, META))


def read_verified(path: str) -> tuple[bytes, dict]:
    """``(state bytes, meta)`` of the checkpoint directory ``path``, its checksum verified.

    Raises :class:`CheckpointError` with one line for a missing or unreadable file, a ``meta.json``
    that is not ours, and contents whose size or sha256 differ from what was stored with them.
    """
    try:
        with open(os.path.join(path, META), "rb") as f:
            meta = json.loads(f.read())
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {META}: {e.strerror or e}") from None
    except ValueError:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {META} is not valid JSON") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("sha256"), str):
        raise CheckpointError(f"checkpoint {path!r} was not written by mpi_sgd (format {FORMAT}): {META} is foreign")
    try:
        with open(os.path.join(path, STATE), "rb") as f:
            blob = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {STATE}: {e.strerror or e}") from None
    if len(blob) != meta.get("bytes") or hashlib.sha256(blob).hexdigest() != meta["sha256"]:
        raise CheckpointError(
            f"checkpoint {path!r} is corrupt: {STATE} ({len(blob)} bytes) does not match the size and "
            "checksum stored with it"
        )
    return blob, meta


def newest_valid(directory: str, warn, fresh_ok: bool = False) -> tuple[str, bytes, dict] | None:
    """The newest (most recently written) checkpoint in ``directory`` that verifies; None if there is none.

    A corrupt one is passed over with ``warn(message)``: a resume loses a few epochs, not the job.
    It is the one ``latest`` names, unless a kill came between a checkpoint's rename and the pointer
    (then it is that newer complete one) or ``latest``'s own checkpoint fails to verify.
    If there are checkpoints but not one verifies (a disk or file-system fault, most likely, not a
    run that never saved), a fresh start would overwrite them: that raises, naming each and why,
    unless ``fresh_ok`` (``--resume auto-or-fresh``) says to start afresh anyway.
    """
    failed = []
    for path in checkpoints(directory):
        try:
            blob, meta = read_verified(path)
        except CheckpointError as e:
            warn(f"warning: skipping {e}")
            failed.append(str(e))
            continue
        return path, blob, meta
    if failed and not fresh_ok:
        raise CheckpointError(
            f"--resume auto: none of the {len(failed)} checkpoint(s) in {directory!r} can be read ("
            + "; ".join(failed)
            + "); starting afresh would overwrite them: fix or move them, or give --resume auto-or-fresh"
        )
    return None
