"""Time to a target: stop training when the held-out loss or accuracy reaches a value, and say what it took.

The measure of MLPerf Training and DAWNBench: not the time per epoch but the wall time (and the
steps, samples and epochs) until the model is as good as asked. It is what a choice of R should
minimise: more ranks shorten each epoch, but past the critical batch they need more epochs (see
:mod:`mpi_sgd.noisescale` and :mod:`mpi_sgd.perfmodel.goodput`).

The held-out set is scored after every epoch and, with ``--eval-every N``, every N steps; the
scores come out of one all-reduce, so every rank sees the same numbers and stops at the same step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """Reached when ``metric`` (``val_loss``: at most ``value``; ``val_accuracy``: at least) is."""

    metric: str
    value: float

    def reached(self, score: float | None) -> bool:
        if score is None or not math.isfinite(score):
            return False
        return score <= self.value if self.metric == "val_loss" else score >= self.value

    def better(self, a: float | None, b: float | None) -> float | None:
        """The better of two scores (None where there is none)."""
        seen = [s for s in (a, b) if s is not None and math.isfinite(s)]
        if not seen:
            return None
        return min(seen) if self.metric == "val_loss" else max(seen)

    @property
    def text(self) -> str:
        return f"{self.metric.replace('_', ' ')} {'<=' if self.metric == 'val_loss' else '>='} {self.value:g}"


def from_config(cfg) -> Target | None:
    """The target ``--target-val-loss`` or ``--target-val-accuracy`` asks for, or None."""
    if cfg.target_val_loss is not None:
        return Target("val_loss", cfg.target_val_loss)
    if cfg.target_val_accuracy is not None:
        return Target("val_accuracy", cfg.target_val_accuracy)
    return None


class TimeToTarget:
    """Watches the scores of one run; :attr:`record` is what ``--metrics-json`` keeps as ``time_to_target``."""

    def __init__(self, target: Target, global_batch: int, steps_per_epoch: int):
        self.target, self.global_batch, self.steps_per_epoch = target, global_batch, steps_per_epoch
        self.best: float | None = None
        self.record: dict | None = None  # set once reached

    @property
    def reached(self) -> bool:
        return self.record is not None

    def check(self, score, step: int, seconds: float, val_loss, val_accuracy, eval_s: float = 0.0) -> bool:
        """A new score after ``step`` optimizer steps and ``seconds`` of training (``eval_s`` of them
        scoring the held-out set with ``--eval-every``): True once reached."""
        self.best = self.target.better(self.best, score)
        if self.record is None and self.target.reached(score):
            self.record = self._at(True, step, seconds) | {"eval_s": eval_s, "val_loss": val_loss}
            self.record["val_accuracy"] = val_accuracy
        return self.reached

    def _at(self, reached: bool, step: int, seconds: float) -> dict:
        return {
            "target": self.target.text,
            "reached": reached,
            "step": step,
            "samples": step * self.global_batch,
            "epochs": step / self.steps_per_epoch,
            "wall_s": seconds,
        }

    def summary(self, step: int, seconds: float) -> dict:
        """The record to report at the end: reached, or how far the run got."""
        if self.record is not None:
            return self.record
        return self._at(False, step, seconds) | {"best": self.best}

    @staticmethod
    def line(record: dict) -> str:
        """One line for the root to print."""
        done = f"{record['step']} steps, {record['samples']} samples, {record['epochs']:.2f} epochs"
        if record["reached"]:
            return f"reached {record['target']} after {done}, {record['wall_s']:.2f} s"
        best = "none" if record["best"] is None else f"{record['best']:.4g}"
        return f"target {record['target']} not reached after {done}, {record['wall_s']:.2f} s (best {best})"
