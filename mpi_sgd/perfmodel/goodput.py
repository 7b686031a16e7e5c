"""Time to a target, not per epoch: [S-SGD]'s law corrected by the steps a bigger batch still needs.

[S-SGD]'s law (:mod:`.scaling`) counts time per epoch. But R ranks at per-rank batch B take the
steps of one process at batch R·B, and past a critical batch a bigger batch does not buy
proportionally fewer steps. McCandlish et al. ("An Empirical Model of Large-Batch Training",
2018, eq. 2.11) give the steps to a fixed loss at global batch B as

    S(B) = S_min · (1 + B_noise / B)

with S_min the fewest steps any batch needs and B_noise the gradient noise scale
(:mod:`mpi_sgd.noisescale` measures it during training). Below B_noise, doubling the batch nearly
halves the steps (each sample counts); above it the steps approach S_min and more samples per step
are wasted. Time to the target at R ranks (weak scaling: per-rank B, global R·B) is then

    T(R) = S(R·B) · T_step(R),     T_step(R) = T_comp + T_sync(R)

and the speedup to the target, against one process at batch B,

    speedup_target(R) = S(B)·T_step(1) / (S(R·B)·T_step(R)) = speedup_epoch(R) · S(B) / (R·S(R·B))

which does not need S_min, only B_noise: where R·B ≪ B_noise, S(R·B) ≈ S(B)/R and the two laws
agree; where R·B ≫ B_noise, S(R·B) ≈ S_min and R ranks buy at most (1 + B_noise/B) of speedup.

Statistical efficiency (Pollux, Qiao et al. OSDI 2021) is the progress a sample buys at batch b
relative to the small-batch limit, E(b) = B_noise/(B_noise + b); goodput, progress per second, is
throughput times E.

Strong scaling keeps the global batch, so S does not change with R and both laws agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .scaling import Compute, check_count, scaling


def steps_to_target(global_batch: float, s_min: float, b_noise: float) -> float:
    """S(B) = S_min·(1 + B_noise/B): steps to a fixed loss at global batch ``global_batch``."""
    if not (global_batch > 0 and s_min > 0 and b_noise >= 0):
        raise ValueError(f"need B > 0, S_min > 0, B_noise >= 0; got {global_batch}, {s_min}, {b_noise}")
    return s_min * (1 + b_noise / global_batch)


def statistical_efficiency(batch: float, b_noise: float) -> float:
    """E(b) = B_noise/(B_noise + b): a sample's share of progress at batch b against small batches."""
    return b_noise / (b_noise + batch) if b_noise > 0 else 0.0


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(S_min, B_noise) from measured (global batch, steps to target) pairs.

    S = S_min + S_min·B_noise·(1/B) is a line in x = 1/B: least squares of steps on 1/B gives the
    intercept S_min and slope S_min·B_noise. Needs two or more batches; raises ValueError where the
    fit is not a valid model (S_min or B_noise not positive: steps did not fall with the batch).
    """
    if len({b for b, _ in points}) < 2:
        raise ValueError("fitting S_min and B_noise needs steps measured at two or more batch sizes")
    xs = [1 / b for b, _ in points]
    ys = [s for _, s in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    s_min = my - slope * mx
    if s_min <= 0 or slope < 0:
        raise ValueError(f"steps do not follow S_min·(1 + B_noise/B) here (S_min {s_min:.3g}, slope {slope:.3g})")
    return s_min, slope / s_min


@dataclass(frozen=True)
class TargetPoint:
    """One R: [S-SGD]'s per-epoch answer and the time-to-target answer side by side."""

    ranks: int
    global_batch: float
    t_step: float
    speedup_epoch: float  # [S-SGD]: samples per second against one process
    steps_ratio: float  # S(global batch) / S(batch at R = 1): steps to the target against one process
    speedup_target: float  # time to the target of one process / time at R
    efficiency: float  # statistical efficiency at this global batch
    seconds: float | None  # time to the target, where S_min is known

    @property
    def pays_epoch(self) -> bool:
        return self.ranks > 1 and self.speedup_epoch > 1

    @property
    def pays(self) -> bool:
        """Faster to the target than one process."""
        return self.ranks > 1 and self.speedup_target > 1


def time_to_target(
    compute: Compute,
    sync: Callable[[int], float],
    ranks: Sequence[int],
    batch: int,
    b_noise: float,
    s_min: float | None = None,
    mode: str = "weak",
) -> list[TargetPoint]:
    """The per-epoch law and the time-to-target model at each R (``batch`` per rank, or global for strong)."""
    if not (b_noise >= 0 and math.isfinite(b_noise)):
        raise ValueError(f"B_noise must be a finite number >= 0, got {b_noise}")
    check_count("batch", batch)
    per_epoch = scaling(compute, sync, ranks, samples=1, batch=batch, mode=mode)
    one = steps_to_target(batch, 1.0, b_noise)  # S at R = 1, in units of S_min
    out = []
    for p in per_epoch:
        global_batch = p.ranks * batch if mode == "weak" else batch
        steps = steps_to_target(global_batch, 1.0, b_noise)
        # time per epoch ratio is speedup_epoch; to the target the sample counts differ by the steps:
        # T(1)/T(R) = S(B)·T_step(1) / (S(R·B)·T_step(R)) = speedup_epoch · S(B)/S(R·B) / R (weak)
        step_ratio = steps / one
        speedup_target = p.speedup * (1 / step_ratio) / (p.ranks if mode == "weak" else 1)
        seconds = s_min * steps * p.t_step if s_min is not None else None
        out.append(
            TargetPoint(
                p.ranks,
                global_batch,
                p.t_step,
                p.speedup,
                step_ratio,
                speedup_target,
                statistical_efficiency(global_batch, b_noise),
                seconds,
            )
        )
    return out


def best(points: Sequence[TargetPoint]) -> TargetPoint:
    """The R that reaches the target soonest (the fewest ranks among ties within 1%)."""
    top = max(p.speedup_target for p in points)
    return min((p for p in points if p.speedup_target >= 0.99 * top), key=lambda p: p.ranks)


def best_batch(
    compute: Compute, sync: Callable[[int], float], ranks: int, batches: Sequence[int], b_noise: float
) -> tuple[int, float]:
    """(per-rank batch, its time to the target in units of S_min·seconds) minimising time at ``ranks``.
    ``compute`` must say the batch its time was measured at, to scale it to each candidate."""
    if compute.batch is None:
        raise ValueError("best_batch needs Compute(t_comp, batch): the batch t_comp was measured at")
    timed = []
    for b in batches:
        (point,) = [p for p in time_to_target(compute, sync, [ranks], b, b_noise) if p.ranks == ranks]
        timed.append((steps_to_target(ranks * b, 1.0, b_noise) * point.t_step, b))
    seconds, b = min(timed)
    return b, seconds


# Short enough for 120 columns: the global batch, steps to the target as a multiple of R = 1's,
# the statistical efficiency, the speedup to the target, the verdicts of the two laws (per epoch, to the target)
TARGET_HEADERS = (
    "R",
    "R·B",
    "T_step (s)",
    "epoch speedup",
    "steps (x R=1)",
    "stat. eff.",
    "target speedup",
    "pays/epoch",
    "pays/target",
)


def target_rows(points: Sequence[TargetPoint], extrapolated: int | None = None) -> list[tuple[str, ...]]:
    """Rows for :data:`TARGET_HEADERS`; R beyond ``extrapolated`` (the largest R measured) marked ``*``."""

    def verdict(p: TargetPoint, pays: bool) -> str:
        return "baseline" if p.ranks == 1 else ("yes" if pays else "no")

    rows = []
    for p in points:
        mark = "*" if extrapolated is not None and p.ranks > extrapolated else ""
        rows.append(
            (
                f"{p.ranks}{mark}",
                f"{p.global_batch:g}",
                f"{p.t_step:.4g}",
                f"{p.speedup_epoch:.2f}",
                f"{p.steps_ratio:.3f}",
                f"{100 * p.efficiency:.0f}%",
                f"{p.speedup_target:.2f}",
                verdict(p, p.pays_epoch),
                verdict(p, p.pays),
            )
        )
    return rows
