"""[S-SGD]'s law: epoch time, speedup and efficiency of synchronous SGD over R replicas.

With ``N`` samples, a per-rank batch ``B`` and ``R`` replicas, every step processes ``R·B``
samples, so an epoch is ``N/(R·B)`` steps of ``T_comp + T_sync``::

    T_epoch(R) = N/(R·B) · (T_comp + T_sync(R)),      T_sync(1) = 0

where ``T_comp`` is one rank's forward + backward + optimizer step on its ``B`` samples and
``T_sync`` the gradient all-reduce on the critical path. Against one process
(``T_epoch(1) = N/B · T_comp``)::

    speedup(R)    = R · T_comp / (T_comp + T_sync)
    efficiency(R) = speedup / R = T_comp / (T_comp + T_sync)

and distribution pays (speedup > 1) exactly when ``T_sync / T_comp < R − 1``. Equality is the
break-even line: with ``T_comp = T_sync = 1 s`` a step of two ranks takes 2 s for 2·B samples,
just what one rank takes for them (speedup 1.00); three ranks take 2 s for 3·B (speedup 1.50). The
model takes [S-SGD]'s continuous step count ``N/(R·B)`` (a loader runs ``⌈N/(R·B)⌉``), so the
speedup does not depend on ``N``, and ``T_sync`` at R = 1 is zero: one process sends nothing.

This is **weak scaling** in the per-step sense (fixed per-rank batch, global batch ``R·B``
grows). **Strong scaling** keeps the global batch ``B`` fixed, so each rank computes ``B/R``
samples for ``N/B`` steps; :class:`Compute` assumes step time is linear in the batch,
``T_comp(b) = t_fixed + (T_comp − t_fixed)·b/B``, ``t_fixed`` being the part no batch size
shrinks (the optimizer step, Python overhead).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

SCALINGS = ("weak", "strong")


def check_time(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def check_count(name: str, value: int, minimum: int = 1) -> None:
    if not (isinstance(value, int) and value >= minimum):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class Compute:
    """One rank's seconds per step (forward + backward + optimizer step) at per-rank batch ``batch``.

    Leave ``batch`` out when ``t_comp`` was measured at the batch the table is for (a trainer's
    own per-step figure): :func:`scaling` then takes it as that batch.
    """

    t_comp: float
    batch: int | None = None
    t_fixed: float = 0.0  # the part that does not shrink with the batch

    def __post_init__(self):
        check_time("t_comp", self.t_comp)
        check_time("t_fixed", self.t_fixed)
        if self.batch is not None:
            check_count("batch", self.batch)
        if self.t_comp <= 0:
            raise ValueError("t_comp must be positive: a step that costs nothing cannot be sped up")
        if self.t_fixed > self.t_comp:
            raise ValueError(f"t_fixed ({self.t_fixed}) cannot exceed t_comp ({self.t_comp})")

    def at_batch(self, batch: float) -> float:
        """Seconds per step at another per-rank batch, linear in the batch."""
        if self.batch is None:
            raise ValueError("this Compute does not say which batch t_comp was measured at")
        return self.t_fixed + (self.t_comp - self.t_fixed) * batch / self.batch


@dataclass(frozen=True)
class FixedSync:
    """A measured or assumed T_sync, the same at every R > 1 ([S-SGD]'s reading)."""

    seconds: float

    def __post_init__(self):
        check_time("t_sync", self.seconds)

    def __call__(self, ranks: int) -> float:
        return 0.0 if ranks == 1 else self.seconds

    def describe(self) -> str:
        return f"T_sync = {self.seconds:g} s at every R > 1"


@dataclass(frozen=True)
class ScalingPoint:
    """One row of the speedup table."""

    ranks: int
    per_rank_batch: float
    steps: float  # per epoch, continuous as in [S-SGD]
    t_comp: float
    t_sync: float
    t_epoch: float
    speedup: float
    efficiency: float
    pays: bool

    @property
    def t_step(self) -> float:
        return self.t_comp + self.t_sync


def scaling(
    compute: Compute,
    sync: Callable[[int], float],
    ranks: Sequence[int],
    samples: int,
    batch: int,
    mode: str = "weak",
) -> list[ScalingPoint]:
    """T_epoch, speedup and efficiency at each R, against one process with the same model.

    ``batch`` is the per-rank batch for ``mode="weak"`` ([S-SGD]) and the global batch for
    ``mode="strong"``. Speedup is computed from per-step times and the step-count ratio, not
    from two rounded epoch times, so the break-even case comes out exactly 1.
    """
    if mode not in SCALINGS:
        raise ValueError(f"unknown scaling {mode!r}; choose one of {', '.join(SCALINGS)}")
    check_count("samples", samples)
    check_count("batch", batch)
    for r in ranks:
        check_count("ranks", r)
        if mode == "strong" and r > batch:
            raise ValueError(f"strong scaling splits the global batch {batch} over {r} ranks: fewer than 1 each")
    if compute.batch is None:
        compute = replace(compute, batch=batch)
    t_step_1 = compute.at_batch(batch)
    points = []
    for r in ranks:
        per_rank = batch if mode == "weak" else batch / r
        t_comp, t_sync = compute.at_batch(per_rank), sync(r)
        t_step = t_comp + t_sync
        steps = samples / (r * batch) if mode == "weak" else samples / batch
        # What one rank alone needs for the samples of one R-rank step: R of its own steps (weak),
        # or the same single step at the full batch (strong). Speedup is that over t_step, and
        # "pays" compares the two directly, so the break-even case is exact, not 0.9999.
        alone = (r if mode == "weak" else 1) * t_step_1
        s = alone / t_step
        points.append(ScalingPoint(r, per_rank, steps, t_comp, t_sync, steps * t_step, s, s / r, t_step < alone))
    return points
