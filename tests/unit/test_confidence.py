"""The distribution-free interval for a median and the three verdicts (mpi_sgd/confidence.py)."""

from __future__ import annotations

import random

import pytest

from mpi_sgd.confidence import Interval, median_interval, paired_ratio, target_line, verdict


def test_the_interval_is_the_order_statistics_of_the_binomial():
    # n = 8: only [min, max] reaches 95% (1 - 2/256 = 99.2%; the next pair gives 93.0%)
    got = median_interval([8, 1, 7, 2, 6, 3, 5, 4])
    assert (got.median, got.low, got.high, got.blocks) == (4.5, 1, 8, 8)
    assert got.coverage == pytest.approx(1 - 2 / 256)
    # n = 16: k = 4 (1 - 2 * 697/65536 = 97.9%; k = 5 gives 92.3%)
    sixteen = median_interval(range(1, 17))
    assert (sixteen.low, sixteen.high) == (4, 13) and sixteen.coverage == pytest.approx(1 - 2 * 697 / 65536)
    # n = 5: no pair reaches 95%; [min, max] with its own coverage, said in the text
    five = median_interval([3, 1, 2, 5, 4])
    assert (five.low, five.high) == (1, 5) and five.coverage == pytest.approx(1 - 2 / 32)
    assert "[94% CI 1.000-5.000, 5 blocks]" in five.text()


def test_the_interval_covers_the_median_as_often_as_it_says():
    rng = random.Random(0)
    hits = sum(
        (lambda i: i.low <= 1.0 <= i.high)(median_interval([rng.lognormvariate(0, 0.5) for _ in range(16)]))
        for _ in range(2000)
    )  # the true median of a lognormal(0, s) is exp(0) = 1
    assert hits / 2000 >= 0.95


def test_ratios_are_paired_block_by_block():
    # a load burst in block 2 slows both variants alike: the paired ratio does not move
    a, b = [1.1, 1.1, 2.2, 1.1, 1.1, 1.1], [1.0, 1.0, 2.0, 1.0, 1.0, 1.0]
    got = paired_ratio(a, b)
    assert got.low == pytest.approx(1.1) and got.high == pytest.approx(1.1)
    with pytest.raises(ValueError, match="not paired"):
        paired_ratio([1.0], [1.0, 2.0])


def test_met_only_when_the_whole_interval_meets_the_target():
    def at(low, high):
        return Interval((low + high) / 2, low, high, 0.99, 8)

    assert verdict(at(1.02, 1.08), 1.10) == "met"
    assert verdict(at(1.05, 1.15), 1.10) == "inconclusive"
    assert verdict(at(1.12, 1.20), 1.10) == "not met"
    assert verdict(at(1.6, 1.9), 1.5, at_most=False) == "met"
    assert verdict(at(1.3, 1.6), 1.5, at_most=False) == "inconclusive"
    line = target_line("step vs local", at(1.12, 1.20), 1.1)
    assert line == "step vs local: 1.160x [95% CI 1.120-1.200, 8 blocks] (project target <= 1.1x: not met here)"


def test_a_long_target_line_carries_its_verdict_on_the_next_line():
    wide = target_line(
        "simplenet: ddp-mpi4py exposed communication vs ddp-gloo's", Interval(0.3, 0.2, 0.4, 0.99, 20), 0.25
    )
    first, second = wide.splitlines()
    assert first == "simplenet: ddp-mpi4py exposed communication vs ddp-gloo's: 0.300x [95% CI 0.200-0.400, 20 blocks]"
    assert second == "    (project target <= 0.25x: inconclusive here)"
    assert max(len(first), len(second)) <= 120 < len(first) + 1 + len(second.strip())
