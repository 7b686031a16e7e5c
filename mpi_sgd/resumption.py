"""Saving the trainer, and resuming it: where the loop stood, and which settings go on.

A checkpoint holds the model, optimizer, RNG, mixed-precision and learning-rate-schedule state
(:mod:`mpi_sgd.checkpoint.trainer_state`). Resuming sets the loop where it stood; the settings a
resumed run may change (:data:`~mpi_sgd.checkpoint.trainer_state.RESUMABLE`: the rate, momentum
and the schedule's flags) are taken from the command line where given there, with a notice that
says what they replace, and from the checkpoint otherwise, so that a flag left at its default
never silently undoes what the run was started with.
"""

from __future__ import annotations

from dataclasses import replace

from .checkpoint import CheckpointError, Progress, resume, save_training
from .checkpoint.trainer_state import settings_on_resume
from .convergence import Convergence


def save(trainer, directory: str) -> None:
    """Checkpoint ``trainer`` (a :class:`~mpi_sgd.trainer.Trainer`) into ``directory``: a collective."""
    t = trainer
    progress = Progress(t.epoch, t.step_in_epoch, t.step, t.epoch_offset, t.comm.size, t.cfg.batch_size)
    save_training(directory, t.comm, t.model, t.optimizer, t.amp, t.cfg, progress, t.conv.schedule)


def load(trainer, path: str, auto: bool | str = False, given=frozenset()) -> str | None:
    """Resume ``trainer`` from ``path``: a ``--checkpoint`` directory (its newest checkpoint), one
    ``step-N`` in it, or, with ``auto``, the newest checkpoint in ``path`` that verifies (None: none
    yet; ``auto="or-fresh"`` also when none can be read). ``given``: the flags on this run's command
    line (:meth:`mpi_sgd.args.ArgumentParser.given`).

    Returns the checkpoint used. Raises :class:`~mpi_sgd.checkpoint.CheckpointError`, on every
    rank alike, for one that cannot be read or fails its checksum, one written for another
    model or optimizer, and one that leaves nothing to train within ``--epochs``/``--max-steps``.
    """
    t = trainer
    found = resume(path, t.comm, t.model, t.optimizer, t.amp, t.cfg, auto)
    if found is None:
        return None
    path, was, saved = found
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
