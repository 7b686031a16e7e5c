"""The trainer's state in a checkpoint: what a run saves, and how another run resumes from it.

A checkpoint of :class:`mpi_sgd.trainer.Trainer` holds the model and optimizer state (a sharded
optimizer gathers its shards into the unsharded format first, so a checkpoint written at one
world size or ZeRO stage loads at any other), the loop's position (epoch, step in the epoch,
steps done), every rank's RNG state and the mixed-precision scaler's. Resuming at the same world
size is bit-exact; at another one, training goes on correctly but not bit for bit (see
:func:`resume`). A checkpoint that does not fit this run fails with one line naming the flags
that differ (:func:`restore`).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import torch

from . import deadline
from .payload import load, serialize
from .store import CheckpointError, save

# What :func:`save_training` writes; a checkpoint lacking any of these is someone else's.
TRAINER_KEYS = ("model", "optimizer", "epoch", "step_in_epoch", "step", "world_size", "rng")


@dataclass(frozen=True)
class Progress:
    """Where the training loop stands: the epoch, steps done in it, and optimizer steps in all;
    ``offset``: samples of the epoch trained before its steps began (by a run at another world
    size), ``world_size`` and ``batch_size``: the run's R and B, which say how many samples a
    step in the epoch took."""

    epoch: int
    step_in_epoch: int
    step: int
    offset: int = 0
    world_size: int = 1
    batch_size: int = 1

    @property
    def samples_in_epoch(self) -> int:
        """How far into the epoch's permutation of the samples the run has got."""
        return self.offset + self.step_in_epoch * self.world_size * self.batch_size


def save_training(
    directory: str, comm, model, optimizer, amp, cfg, progress: Progress, schedule=None, data: dict | None = None
) -> bool:
    """Checkpoint the run into ``directory`` (``--checkpoint``), keeping ``cfg.keep_checkpoints``.

    A collective: every rank sends its RNG state to the root (dropout masks differ per rank, so a
    resume is bit-exact only with all of them), and a sharded optimizer gathers its shards; then
    the root writes. ``schedule`` (an :class:`~mpi_sgd.lrschedule.LRSchedule`) is saved with them,
    and ``data`` (what the run trained on: :func:`mpi_sgd.resumption.data_identity`) in the metadata.
    Returns whether a checkpoint was written (not when the parameters are not finite), on every rank.
    """
    mine = torch.get_rng_state()
    rng = torch.zeros(comm.size, mine.numel(), dtype=torch.uint8) if comm.is_root else None
    comm.gather(mine, rng)
    full_state = getattr(optimizer, "full_state_dict", None)  # mpi_sgd.zero: a collective
    model_state, optimizer_state = full_state() if full_state else (model.state_dict(), optimizer.state_dict())
    write = None
    if comm.is_root:
        write = _writer(directory, comm, model_state, optimizer_state, rng, amp, cfg, progress, schedule, data)
    what = f"saving step {progress.step} to {directory!r}"
    written = deadline.run(comm, write or (lambda: None), what, getattr(cfg, "save_timeout", 0.0))
    # Whether it was written (the root refuses a non-finite state), on every rank: for the messages.
    return bool(comm.bcast_obj(written is not None if comm.is_root else None))


def _writer(directory: str, comm, model_state, optimizer_state, rng, amp, cfg, progress: Progress, schedule, data):
    """The root's save, to run off the main thread (:mod:`.deadline`); None to save nothing."""
    # The parameters are the same on every rank; a non-finite state must never replace the last
    # good checkpoint (training stops before one, unless the optimizer itself overflowed).
    if not all(torch.isfinite(t).all() for t in model_state.values() if t.is_floating_point()):
        print(
            f"warning: not saving a checkpoint at step {progress.step}: the parameters are not finite; "
            f"the last good checkpoint in {directory} stays",
            file=sys.stderr,
            flush=True,
        )
        return None
    state = {
        "model": model_state,
        "optimizer": optimizer_state,
        "epoch": progress.epoch,
        "step_in_epoch": progress.step_in_epoch,
        "step": progress.step,
        "epoch_offset": progress.offset,
        "world_size": comm.size,
        "rng": rng,
        "amp": amp.state_dict(),
        "schedule": schedule.state_dict() if schedule is not None else None,
    }
    meta = {"step": progress.step, "epoch": progress.epoch, "world_size": comm.size, "config": asdict(cfg)}
    meta["data"] = data
    return lambda: save(serialize(state), meta, directory, progress.step, cfg.keep_checkpoints)


# Flags a resumed run may change (a notice says so) and otherwise takes from the checkpoint; the
# rest (model, dataset, dtype, optimizer) must match, or the checkpoint is refused naming them.
RESUMABLE = ("lr", "momentum", "lr_scaling", "base_batch", "warmup", "schedule", "adascale")


def settings_on_resume(saved: dict, cfg, given) -> tuple[dict, list[str]]:
    """The :data:`RESUMABLE` settings a resumed run trains with: each flag ``given`` on its command
    line as given (with a notice where it replaces the checkpoint's value), each other one as the
    checkpoint had it. Returns (the changes to make to ``cfg``, the notices)."""
    changes, notices = {}, []
    for name in RESUMABLE:
        if name not in saved or saved[name] == getattr(cfg, name):
            continue
        flag = "--" + name.replace("_", "-")
        if name in given:
            notices.append(f"{flag} {getattr(cfg, name)} replaces {saved[name]} from the checkpoint")
        else:
            changes[name] = saved[name]
    return changes, notices


def resume(path: str, comm, model, optimizer, amp, cfg, auto: bool | str = False) -> tuple[str, Progress, dict] | None:
    """Load the checkpoint at ``path`` into ``model``, ``optimizer`` and ``amp`` on every rank, and
    set this rank's RNG: the checkpoint used, where the loop stands and what else it saved
    (``{"config": its flags, "schedule": the learning-rate schedule's state}``); None if ``auto``
    found none.

    ``path`` as :func:`~mpi_sgd.checkpoint.load` takes it. Raises :class:`CheckpointError`, on
    every rank alike, for one that cannot be read or fails its checksum, and one written for
    another model or optimizer.
    """
    found = load(path, comm, auto=auto, timeout=getattr(cfg, "save_timeout", 0.0))
    if found is None:
        return None
    state, meta, path = found
    restore(state, model, optimizer, path, meta, asdict(cfg))
    amp.load_state_dict(state.get("amp"))
    saved_batch = ((meta or {}).get("config") or {}).get("batch_size", cfg.batch_size)
    at = (state["epoch"], state["step_in_epoch"], state["step"], state.get("epoch_offset", 0))
    progress = Progress(*at, world_size=state["world_size"], batch_size=saved_batch)
    if state["world_size"] == comm.size:
        torch.set_rng_state(state["rng"][comm.rank].clone())
    else:
        # A different world size: training goes on correctly but not bit for bit: each rank gets a
        # fresh dropout stream (the caller carries an interrupted epoch on at the new R*B).
        torch.manual_seed(cfg.seed + comm.rank + 1_000_003 * progress.step)
    # a checkpoint from before schedules: the rules restart at its step
    schedule = state.get("schedule") or {"step": progress.step, "tau": float(progress.step)}
    meta = meta or {}
    return path, progress, {"config": meta.get("config") or {}, "schedule": schedule, "data": meta.get("data")}


def restore(state, model, optimizer, path: str, meta: dict | None = None, config: dict | None = None) -> None:
    """Load a trainer checkpoint's model and optimizer state, or say in one line why it does not fit.

    ``meta`` (with the ``config`` the checkpoint was made with) and this run's ``config`` let the
    message name the flags that differ.
    """
    missing = [k for k in TRAINER_KEYS if k not in state] if isinstance(state, dict) else list(TRAINER_KEYS)
    if missing:
        raise CheckpointError(f"{path!r} is not a checkpoint of mpi_sgd's trainer: it has no {', '.join(missing)}")
    if meta is None:
        raise CheckpointError(
            f"{path!r} is a single file with no checksum to verify; checkpoints are directories written by "
            "--checkpoint DIR (resume from DIR)"
        )
    differs = _differences((meta or {}).get("config") or {}, config or {})
    saved = state["model"]
    if hasattr(optimizer, "load_full_state_dict"):  # sharded (mpi_sgd.zero): each rank takes its shards
        try:
            optimizer.load_full_state_dict(saved, state["optimizer"])
        except (ValueError, KeyError, IndexError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {path!r} does not fit this model and optimizer{differs}: {e}") from None
        return
    mine = model.state_dict()
    for name in sorted(saved.keys() | mine.keys()):
        there = tuple(saved[name].shape) if name in saved else "absent"
        here = tuple(mine[name].shape) if name in mine else "absent"
        if there != here:
            raise CheckpointError(
                f"checkpoint {path!r} was written for another model: {name} is {there} there and {here} "
                f"here{differs}; resume with the --model and --dataset it was trained with"
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
        raise CheckpointError(
            f"checkpoint {path!r} was written with another --optimizer{differs}; resume with the one it used"
        )


def _differences(then: dict, now: dict) -> str:
    """' (made with --model ffnet, here mlp)': the model-shaping flags that differ, or ''."""
    fields = ("model", "dataset", "dtype", "optimizer")
    diff = [f"--{f} {then[f]}, here {now[f]}" for f in fields if f in then and f in now and then[f] != now[f]]
    return f" (it was made with {'; '.join(diff)})" if diff else ""
