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
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import time

FORMAT = 1
STATE, META, LATEST = "state.pt", "meta.json", "latest"
TEMP_PREFIX = ".tmp-"
SAVE_FAULT = "MPI_SGD_SAVE_FAULT"  # the test hook of :func:`save_fault`
_STEP = re.compile(r"^step-(\d+)$")


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
    tmp = _temp_name(directory)
    meta_blob = json.dumps(meta, indent=1).encode()
    try:
        _injected_fault(tmp, len(blob))
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
    if os.path.exists(final):  # the same step written again, e.g. a rerun into the same directory
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


def save_fault() -> tuple[str, float] | None:
    """``MPI_SGD_SAVE_FAULT``, the test hook that makes storage misbehave: ``slow:SECONDS`` (each
    save first sleeps that long: a slow or hung file system), ``slow-read:SECONDS`` (each read of a
    checkpoint does) or ``full`` (each save fails as on a full disk, after writing half its state).
    None when unset; ValueError, one line, when bad."""
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
        if seconds >= 0:
            return kind, seconds
    raise ValueError(f"{SAVE_FAULT}={text!r}: expected slow:SECONDS (e.g. slow:30), slow-read:SECONDS or full")


def _injected_fault(tmp: str, size: int) -> None:
    fault = save_fault()
    if fault is None:
        return
    kind, seconds = fault
    if kind == "slow":
        time.sleep(seconds)
    if kind != "full":
        return
    os.mkdir(tmp)
    _write(os.path.join(tmp, STATE), b"\0" * (size // 2))  # what a disk filling up mid-write leaves
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), STATE)


def injected_read_delay() -> None:
    """The test hook's ``slow-read:SECONDS``: a read of a checkpoint first sleeps that long."""
    fault = save_fault()
    if fault is not None and fault[0] == "slow-read":
        time.sleep(fault[1])


def checkpoints(directory: str) -> list[str]:
    """The ``step-N`` directories in ``directory``, newest (highest N) first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(int(m.group(1)), n) for n in names if (m := _STEP.match(n))]
    return [os.path.join(directory, n) for _, n in sorted(found, reverse=True)]


def latest(directory: str) -> str | None:
    """The checkpoint ``latest`` names, or None if there is no such pointer."""
    try:
        with open(os.path.join(directory, LATEST)) as f:
            name = f.read().strip()
    except OSError:
        return None
    return os.path.join(directory, name) if _STEP.match(name) else None


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
    """The newest (highest step) checkpoint in ``directory`` that verifies; None if there is none.

    A corrupt one is passed over with ``warn(message)``: a resume loses a few epochs, not the job.
    The newest complete one may be newer than ``latest`` (a kill between the rename and the pointer).
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
