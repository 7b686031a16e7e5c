"""The statistical side of the trainer's loop: the rate each step uses, the noise it measures, the target it watches.

Three things that decide *how many* steps a run needs rather than how long each takes, kept out of
the loop (:class:`mpi_sgd.trainer.Trainer`) that calls them:

* the learning rate before every step (:class:`mpi_sgd.lrschedule.LRSchedule`: scaling with the
  global batch, warm-up, schedule, AdaScale);
* the gradient noise scale (:class:`mpi_sgd.noisescale.NoiseProbe`, attached to the strategy), read
  per epoch from sums that ride in the epoch's all-reduce, and every step for AdaScale;
* the target (:class:`mpi_sgd.target.TimeToTarget`), checked on every held-out score.
"""

from __future__ import annotations

import math

import torch

from .lrschedule import LRSchedule, parse_warmup, scale_factor, set_rate
from .noisescale import NoiseProbe, estimate
from .target import TimeToTarget, from_config


class Convergence:
    """Built by the trainer from its configuration; every rank holds one and makes the same calls."""

    def __init__(self, cfg, comm, sync, steps_per_epoch: int, total_steps: int):
        self.cfg, self.comm, self.sync = cfg, comm, sync
        global_batch = comm.size * cfg.batch_size
        self.base_batch = cfg.base_batch or cfg.batch_size
        scale = global_batch / self.base_batch
        n, unit = parse_warmup(cfg.warmup)
        warmup = n * steps_per_epoch if unit == "epochs" else n
        # AdaScale counts progress in steps at the base batch (tau): so does its schedule's length
        span = scale if cfg.adascale else 1.0
        self.schedule = LRSchedule(
            lr=cfg.lr,
            factor=scale_factor(cfg.lr_scaling, global_batch, self.base_batch),
            warmup_steps=warmup * span,
            total_steps=total_steps * span,
            schedule=cfg.schedule,
            adascale=cfg.adascale,
            scale=scale,
        )
        self.last_rate = cfg.lr
        self.rules = cfg.lr_scaling != "none" or cfg.schedule != "constant" or bool(n) or cfg.adascale
        self.probe = None
        if cfg.noise_scale or cfg.adascale:
            numel = sum(p.numel() for p in sync.params)
            device = sync.params[0].device
            self.probe = sync.noise = NoiseProbe(cfg.batch_size, cfg.grad_accum, comm.size, numel, device)
        self.eval_seconds = 0.0  # spent scoring the held-out set between epochs (--eval-every)
        target = from_config(cfg)
        self.target = TimeToTarget(target, global_batch, steps_per_epoch) if target else None

    def describe(self) -> list[str]:
        """Lines for the root to print at the start: what the run's rate and noise measurement are."""
        lines = []
        if self.rules:
            s = self.schedule
            rule = "AdaScale" if s.adascale else f"{self.cfg.lr_scaling} scaling x{s.factor:.3g}"
            warm = f", warm-up {self.cfg.warmup}" if s.warmup_steps else ""
            lines.append(f"learning rate: {self.cfg.lr:g} at batch {self.base_batch}, {rule}{warm}, {s.schedule}")
        if self.probe is not None:
            lines.append(f"noise scale: {self.probe.source}")
        return lines

    def unfinished(self) -> str | None:
        """AdaScale's schedule runs in scale-invariant steps: τ grows by the gain r <= S a step, so
        in the optimizer steps of --epochs it reaches its end only if r stayed at S. Where it did not
        get there, a line for the end of the run that says how far it got (None otherwise)."""
        s = self.schedule
        if not s.adascale or s.tau >= s.total_steps or (s.schedule == "constant" and s.tau >= s.warmup_steps):
            return None
        return (
            f"AdaScale: the {s.schedule} schedule got to {s.tau:.0f} of its {s.total_steps:.0f} scale-invariant "
            f"steps (the gain averaged {s.tau / max(s.step, 1):.2f} of S = {s.scale:.3g}), its rate still "
            f"{s.rate_at(s.tau) / (s.lr * s.factor):.0%} of the peak: AdaScale (Johnson et al.) trains on until "
            "it ends; give more --epochs for that"
        )

    # -- every step -------------------------------------------------------------------------
    def before_step(self, optimizer) -> None:
        if self.rules:
            self.last_rate = self.schedule.next_rate()
            set_rate(optimizer, self.last_rate)

    def after_step(self, finite: bool) -> None:
        """AdaScale: this step's squared norms summed over ranks (one small all-reduce) feed the gain."""
        if not (self.cfg.adascale and self.probe is not None):
            return
        step = self.probe.last.clone() if finite else torch.full_like(self.probe.last, math.nan)
        self.comm.allreduce(step, "sum")  # every rank alike, even after a skipped step
        small, samples, big, steps = step.tolist()
        b_small, b_big = self.probe.batches
        if samples and steps and b_big > b_small:
            g2, trace = estimate(small / samples, big / steps, b_small, b_big)
            self.schedule.observe(g2, trace, self.base_batch)

    def eval_due(self, step: int) -> bool:
        return self.target is not None and bool(self.cfg.eval_every) and step % self.cfg.eval_every == 0

    # -- every epoch ------------------------------------------------------------------------
    def epoch_sums(self, device) -> torch.Tensor:
        """This rank's noise sums for the epoch's all-reduce (nothing without a probe); resets them."""
        if self.probe is None:
            return torch.zeros(0, dtype=torch.float64, device=device)
        sums = self.probe.sums.clone()
        self.probe.sums.zero_()
        return sums

    def epoch_row(self, reduced: list[float]) -> dict:
        """The epoch's noise-scale estimate (``b_noise``, ``g2``, ``trace``), and the rate last used."""
        row = {"lr": self.last_rate} if self.rules else {}
        if self.probe is not None:
            row["noise"] = self.probe.read(reduced)
            row["b_noise"] = row["noise"]["b_noise"]
        return row

    def check_target(self, row: dict, step: int, seconds: float) -> bool:
        """A held-out score (``val_loss``/``val_accuracy`` in ``row``): True once the target is reached."""
        if self.target is None:
            return False
        score = row.get(self.target.target.metric)
        return self.target.check(score, step, seconds, row.get("val_loss"), row.get("val_accuracy"), self.eval_seconds)

    @property
    def reached(self) -> bool:
        return self.target is not None and self.target.reached
