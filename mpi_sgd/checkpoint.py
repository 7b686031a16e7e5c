"""Checkpoints that are never half-written, and that load without running pickled code.

Writing: the root rank saves to a temporary file in the target's directory, flushes and fsyncs
it, then ``os.replace``\\ s it over the target (atomic on POSIX within one filesystem) and fsyncs
the directory so the rename itself survives a crash. A reader sees the old checkpoint or the
new one, never a mixture; a job killed mid-write leaves at most a stray temporary file.

Reading: ``torch.load(weights_only=True)`` accepts tensors and plain containers only. The root
reads the file and broadcasts its contents, so the other ranks need not see the same filesystem.
A file that cannot be read, or that was written for another model or optimizer, raises
:class:`CheckpointError` with one line, on every rank alike.
"""

from __future__ import annotations

import contextlib
import os
import pickle
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


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit; the message is the whole story."""


def read(path: str):
    """``torch.load(path, weights_only=True)``, failing with one line that names the file.

    torch's own messages run to a dozen lines, and for a file holding other objects they advise
    turning ``weights_only`` off, which would run whatever code the file carries: never the fix
    for a checkpoint that this trainer, which writes tensors and plain containers only, did not write.
    """
    try:
        return torch.load(path, weights_only=True)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {e.strerror or e}") from None
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


def load(path: str, comm, root: int = 0):
    """The checkpoint at ``path`` on every rank, read once by ``root``.

    A file the root cannot read raises :class:`CheckpointError` on every rank alike (the root
    broadcasts the error in place of the contents), so no rank is left waiting for the others.
    """
    state, error = None, None
    if comm.rank == root:
        try:
            state = read(path)
        except CheckpointError as e:
            error = str(e)
    state, error = comm.bcast_obj((state, error), root)
    if error:
        raise CheckpointError(error)
    return state


# What :meth:`mpi_sgd.trainer.Trainer` writes; a checkpoint lacking any of these is someone else's.
TRAINER_KEYS = ("model", "optimizer", "epoch", "step_in_epoch", "step", "world_size", "rng")


def restore(state, model, optimizer, path: str) -> None:
    """Load a trainer checkpoint's model and optimizer state, or say in one line why it does not fit."""
    missing = [k for k in TRAINER_KEYS if k not in state] if isinstance(state, dict) else list(TRAINER_KEYS)
    if missing:
        raise CheckpointError(f"{path!r} is not a checkpoint of mpi_sgd's trainer: it has no {', '.join(missing)}")
    saved = state["model"]
    if hasattr(optimizer, "load_full_state_dict"):  # sharded (mpi_sgd.zero): each rank takes its shards
        try:
            optimizer.load_full_state_dict(saved, state["optimizer"])
        except (ValueError, KeyError, IndexError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {path!r} does not fit this model and optimizer: {e}") from None
        return
    mine = model.state_dict()
    for name in sorted(saved.keys() | mine.keys()):
        there = tuple(saved[name].shape) if name in saved else "absent"
        here = tuple(mine[name].shape) if name in mine else "absent"
        if there != here:
            raise CheckpointError(
                f"checkpoint {path!r} was written for another model: {name} is {there} there and {here} "
                "here; resume with the --model and --dataset it was trained with"
            )
    model.load_state_dict(saved)
    # torch fills in group settings added by newer versions; a setting still missing after loading
    # (betas for Adam, momentum for SGD) means the checkpoint's optimizer was another one.
    wanted = optimizer.state_dict()["param_groups"][0].keys()
    try:
        optimizer.load_state_dict(state["optimizer"])
        ok = wanted <= optimizer.state_dict()["param_groups"][0].keys()
    except (ValueError, KeyError, IndexError):
        ok = False
    if not ok:
        raise CheckpointError(f"checkpoint {path!r} was written with another --optimizer; resume with the one it used")
