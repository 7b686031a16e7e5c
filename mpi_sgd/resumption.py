"""Saving the trainer, and resuming it: where the loop stood, and which settings go on.

A checkpoint holds the model, optimizer, RNG, mixed-precision and learning-rate-schedule state
(:mod:`mpi_sgd.checkpoint.trainer_state`). Resuming sets the loop where it stood; the settings a
resumed run may change (:data:`~mpi_sgd.checkpoint.trainer_state.RESUMABLE`: the rate, momentum
and the schedule's flags) are taken from the command line where given there, with a notice that
says what they replace, and from the checkpoint otherwise, so that a flag left at its default
never silently undoes what the run was started with. A checkpoint resumes only on the data it
was trained on (:func:`check_same_data`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, replace

from .agree import data_fingerprint
from .checkpoint import CheckpointError, Progress, hold, resume, save_training
from .checkpoint.trainer_state import settings_on_resume
from .convergence import Convergence


def save(trainer, directory: str) -> bool:
    """Checkpoint ``trainer`` (a :class:`~mpi_sgd.trainer.Trainer`) into ``directory``: a collective.
    Whether it was written, the same on every rank."""
    t = trainer
    # Trainer.from_config took the directory's lock at the start; a Trainer built by hand takes it
    # here, at its first save (the lock is this process's from then on, so later saves pass at once).
    hold(directory, t.comm)
    progress = Progress(t.epoch, t.step_in_epoch, t.step, t.epoch_offset, t.comm.size, t.cfg.batch_size)
    return save_training(
        directory, t.comm, t.model, t.optimizer, t.amp, t.cfg, progress, t.conv.schedule, data_identity(t)
    )


def data_identity(trainer) -> dict:
    """What the run trains and scores on: the sample counts and a hash of every byte of both sets
    (the hash the ranks compare at the start, :func:`mpi_sgd.agree.start_fields`; worked out again
    here, once per run, on the first save or resume, and kept)."""
    t = trainer
    if getattr(t, "_data_identity", None) is None:
        held_out = 0 if t.val is None else len(t.val)
        t._data_identity = {"train": len(t.dataset), "held_out": held_out, "digest": data_fingerprint(t.dataset, t.val)}
    return t._data_identity


# The flags that decide which samples a run trains and scores on, and in what form.
DATA_FLAGS = ("dataset", "val_fraction", "seed", "dtype")


def check_same_data(saved: dict | None, config: dict, trainer, path: str) -> None:
    """Refuse, in one line on every rank alike, to resume on other data than the checkpoint's: its
    epoch and step index the samples it was trained on, so going on over others would mix two
    datasets with no word. Another file of the same shape, another held-out split (``--val-fraction``,
    ``--seed``) or a file changed since all count. Checkpoints from before the data was recorded
    pass unchecked."""
    here = data_identity(trainer)
    if not saved or saved.get("digest") in (None, here["digest"]):
        return
    now = asdict(trainer.cfg)

    def named(flag, value):  # a file named another way (./a.npz, a.npz) is no difference to name
        return os.path.basename(os.path.normpath(value)) if flag == "dataset" else value

    flags = [f for f in DATA_FLAGS if f in config and named(f, config[f]) != named(f, now[f])]
    why = "; ".join(f"--{f.replace('_', '-')} {config[f]}, here {now[f]}" for f in flags)

    def sets(d):
        return f"{d['train']} training and {d['held_out']} held-out samples, hash {d['digest']}"

    raise CheckpointError(
        f"checkpoint {path!r} was trained on other data ({sets(saved)}) than this run's ({sets(here)}): "
        + (f"it was made with {why}" if why else "the data file's contents differ from when it was made")
        + "; resume on the data it was trained with, or start afresh in another --checkpoint directory"
    )


def load(trainer, path: str, auto: bool | str = False, given=frozenset()) -> str | None:
    """Resume ``trainer`` from ``path``: a ``--checkpoint`` directory (its newest checkpoint), one
    ``step-N`` in it, or, with ``auto``, the newest checkpoint in ``path`` that verifies (None: none
    yet; ``auto="or-fresh"`` also when none can be read). ``given``: the flags on this run's command
    line (:meth:`mpi_sgd.args.ArgumentParser.given`).

    Returns the checkpoint used. Raises :class:`~mpi_sgd.checkpoint.CheckpointError`, on every
    rank alike, for one that cannot be read or fails its checksum, one written for another
    model or optimizer, one trained on other data (:func:`check_same_data`), and one that leaves
    nothing to train within ``--epochs``/``--max-steps``.
    """
    t = trainer
    found = resume(path, t.comm, t.model, t.optimizer, t.amp, t.cfg, auto)
    if found is None:
        return None
    path, was, saved = found
    check_same_data(saved.get("data"), saved["config"], t, path)
    _settings(t, saved, given)
    n, size, batch = len(t.dataset), t.comm.size, t.cfg.batch_size
    at = carry_on(was, n, size, batch)
    if (was.world_size, was.batch_size) != (size, batch) and t.comm.is_root:
        print(resize_notice(was, at, n, size, batch), flush=True)
    t.epoch, t.step_in_epoch, t.step, t.epoch_offset = at.epoch, at.step_in_epoch, at.step, at.offset
    if t.epoch >= t.cfg.epochs or t._done():
        limit = f"--epochs {t.cfg.epochs}" + (f" --max-steps {t.cfg.max_steps}" if t.cfg.max_steps else "")
        raise CheckpointError(
            f"checkpoint {path!r} is already at epoch {t.epoch}, step {t.step}: nothing is left to train "
            f"with {limit}; raise {'them' if t.cfg.max_steps else 'it'} to train on"
        )
    return path


def carry_on(at: Progress, n: int, world_size: int, batch_size: int) -> Progress:
    """``at`` (a checkpoint's progress) as a run of ``world_size`` ranks and ``batch_size`` samples per
    rank goes on from it over ``n`` samples: unchanged at the same R and B; otherwise the epoch it
    interrupted goes on at the new global batch from the first sample not yet trained, or, if fewer
    than one global batch is left of it, the next epoch starts."""
    if (at.world_size, at.batch_size) == (world_size, batch_size):
        return at
    done = at.samples_in_epoch
    if done and n - done >= world_size * batch_size:
        return Progress(at.epoch, 0, at.step, done, world_size, batch_size)
    return Progress(at.epoch + (done > 0), 0, at.step, 0, world_size, batch_size)


def resize_notice(saved: Progress, now: Progress, n: int, world_size: int, batch_size: int) -> str:
    """One line: the global batch before and after, and where the interrupted epoch goes on."""
    was, new = saved.world_size * saved.batch_size, world_size * batch_size
    text = (
        f"resuming at a global batch of {new} ({world_size} ranks x {batch_size}) from a checkpoint made at "
        f"{was} ({saved.world_size} x {saved.batch_size})"
    )
    done = saved.samples_in_epoch
    if not done:
        return text + f"; epoch {now.epoch} starts afresh"
    if now.offset:
        return text + f"; epoch {now.epoch} goes on from sample {done} of {n}"
    left = f"; epoch {saved.epoch} had {n - done} of {n} samples left, fewer than one global batch"
    return text + f"{left}: epoch {now.epoch} starts"


def _settings(t, saved: dict, given) -> None:
    """The resumable flags ``given`` replace the checkpoint's, with a notice; the others continue as
    the checkpoint had them. Then the schedule carries on from its saved state."""
    changes, notices = settings_on_resume(saved["config"], t.cfg, given)
    t.cfg = replace(t.cfg, **changes)
    t.conv = Convergence(t.cfg, t.comm, t.sync, t.steps_per_epoch, t.cfg.epochs * t.steps_per_epoch)
    t.conv.schedule.load_state_dict(saved["schedule"])
    for group in t.optimizer.param_groups:  # what the checkpoint's optimizer state left there
        group["lr"] = t.cfg.lr
        if "momentum" in group:
            group["momentum"] = t.cfg.momentum
    for line in notices if t.comm.is_root else ():
        print(line, flush=True)
