"""What a training run measured, as ``--metrics-json`` writes it: one record, gathered on the root.

Kept apart from the loop (:class:`mpi_sgd.trainer.Trainer`) that fills it: the record's shape is
what other tools read (``bench validate``, ``bench goodput``, ``examples/speedup.py
--metrics-json``), and it changes for their sake, not the loop's.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

from .timing import WARMUP_STEPS, slowest_after_warmup


def collect(trainer) -> dict:
    """What ``--metrics-json`` writes (on the root; other ranks get ``{}``). Times in seconds.

    * ``world_size``, ``backend``, ``effective_batch`` (R*B), ``steps_per_epoch``, ``steps``
      (optimizer steps done, counting those before a resume), ``config`` (every flag);
    * ``epochs``: ``[{"epoch", "loss", "accuracy" (null for regression), "val_loss",
      "val_accuracy" (null without a held-out set), "seconds"}]``, loss and accuracy averaged
      over all R*B samples of every step of the epoch, the val ones over the held-out set after it;
    * ``t_comp``, ``t_sync``: one list per rank (index = rank), one entry per step run by this
      launch: ``t_sync`` the time blocked in gradient communication, ``t_comp`` the rest of the
      step (forward, backward, optimizer), so ``t_comp + t_sync`` is the step time;
    * ``summary``: ``{"t_comp", "t_sync"}``, per step the slowest rank, averaged over the steps
      after the first ``warmup_steps``;
    * ``time_to_target``: the steps, samples, epochs and seconds to ``--target-val-*`` (or how far
      the run got), null without a target; each epoch also has ``b_noise`` (``--noise-scale``)
      and ``lr`` (the rate of its last step) where the run measures or schedules them.
    """
    per_rank = trainer.comm.gather_obj((trainer.t_comp, trainer.t_sync))
    if not trainer.comm.is_root:
        return {}
    t_comp = [r[0] for r in per_rank]
    t_sync = [r[1] for r in per_rank]
    summary = {}
    for name, series in (("t_comp", t_comp), ("t_sync", t_sync)):
        slowest = slowest_after_warmup(series, WARMUP_STEPS)
        summary[name] = statistics.fmean(slowest) if slowest else 0.0
    return {
        "skipped_steps": trainer.skipped,
        "overflow_skipped_steps": trainer.amp.overflows,
        "time_to_target": trainer.time_to_target(),
        "world_size": trainer.comm.size,
        "backend": trainer.comm.backend,
        "effective_batch": trainer.comm.size * trainer.cfg.batch_size,
        "steps_per_epoch": trainer.steps_per_epoch,
        "steps": trainer.step,
        "config": asdict(trainer.cfg),
        "epochs": trainer.history,
        "summary": summary,
        "warmup_steps": WARMUP_STEPS,
        "t_comp": t_comp,
        "t_sync": t_sync,
    }
