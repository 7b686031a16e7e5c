"""Verdicts with confidence: a benchmark's ratio, its 95% interval, and "met" only when the whole
interval meets the target.

A benchmark here times its variants in interleaved blocks (:func:`mpi_sgd.timing.time_interleaved`),
so block ``i`` of every variant ran in the same stretch of time, under the same load. The ratio of
two variants is therefore taken block by block (paired), and its median is the figure reported.
The interval is the distribution-free one for a median (Hoefler and Belli, "Scientific
Benchmarking of Parallel Computing Systems", SC 2015; Le Boudec, "Performance Evaluation of
Computer and Communication Systems", 2.1): with ``n`` ordered ratios ``r(1) <= ... <= r(n)``,
``[r(k), r(n+1-k)]`` covers the true median with probability ``1 - 2 P(Binomial(n, 1/2) < k)``,
whatever the distribution of the blocks; ``k`` is the largest with that at least 95%. Below six
blocks no such ``k`` exists; then the interval is ``[min, max]`` and its (lower) coverage is stated.

The verdict (:func:`verdict`) is "met" when the whole interval meets the target, "not met" when none
of it does, and "inconclusive" otherwise: the run cannot tell, and more blocks (``--rounds``) or a
quieter machine can. The targets are the project's, so a line says "project target" and "here".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
WIDTH = 120  # columns of the terminal the benchmarks print for


@dataclass(frozen=True)
class Interval:
    """A median ratio and its distribution-free interval; ``coverage`` is the interval's own level."""

    median: float
    low: float
    high: float
    coverage: float
    blocks: int

    def text(self, digits: int = 3) -> str:
        level = "95%" if self.coverage >= LEVEL else f"{100 * self.coverage:.0f}%"
        return (
            f"{self.median:.{digits}f}x [{level} CI {self.low:.{digits}f}-{self.high:.{digits}f}, {self.blocks} blocks]"
        )


def _below(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) < k)."""
    return sum(math.comb(n, i) for i in range(k)) / 2**n


def median_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The median of ``values`` and the distribution-free interval around it (see the module)."""
    v = sorted(float(x) for x in values)
    n = len(v)
    if n == 0:
        raise ValueError("no blocks to make an interval from")
    mid = (v[(n - 1) // 2] + v[n // 2]) / 2
    k = 0
    while k + 1 <= n // 2 and 1 - 2 * _below(n, k + 1) >= level:
        k += 1
    k = max(k, 1)
    return Interval(mid, v[k - 1], v[n - k], 1 - 2 * _below(n, k), n)


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> Interval:
    """Block-by-block ratio of two variants timed in the same interleaved rounds."""
    if len(numerator) != len(denominator):
        raise ValueError(f"{len(numerator)} blocks against {len(denominator)}: not paired")
    return median_interval([a / b for a, b in zip(numerator, denominator, strict=True)])


def verdict(interval: Interval, target: float, at_most: bool = True) -> str:
    """'met', 'not met' or 'inconclusive': the whole interval within ``target`` (at most, or at
    least with ``at_most=False``), none of it, or some of it."""
    inside = (
        (interval.high <= target, interval.low <= target)
        if at_most
        else (interval.low >= target, interval.high >= target)
    )
    return "met" if inside[0] else "inconclusive" if inside[1] else "not met"


def target_line(what: str, interval: Interval, target: float, at_most: bool = True, digits: int = 3) -> str:
    """``what: 1.084x [95% CI 1.061-1.102, 8 blocks] (project target <= 1.1x: met)``; a target the
    run misses reads "not met here" or "inconclusive here": the targets are the project's, and a
    figure of this machine, under this load, is what the line reports."""
    said = verdict(interval, target, at_most)
    sign = "<=" if at_most else ">="
    figure = f"{what}: {interval.text(digits)}"
    return fit_line(figure, f"(project target {sign} {target:g}x: {said}{'' if said == 'met' else ' here'})")


def fit_line(head: str, tail: str) -> str:
    """``head tail`` on one line if it fits a terminal's :data:`WIDTH`, else ``tail`` on the next, indented."""
    return f"{head} {tail}" if len(head) + 1 + len(tail) <= WIDTH else f"{head}\n    {tail}"
