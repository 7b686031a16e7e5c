"""The time-to-target model as arithmetic (mpi_sgd.perfmodel.goodput): no processes.

Comparisons are of formulas of a few float operations: rel 1e-9 covers their rounding.
"""

from __future__ import annotations

import itertools
import random

import pytest

from mpi_sgd import perfmodel as pm


def test_steps_follow_the_empirical_model():
    assert pm.steps_to_target(50, 28, 50) == pytest.approx(56)
    assert pm.steps_to_target(1e12, 28, 50) == pytest.approx(28)  # S_min: the fewest any batch needs
    assert pm.statistical_efficiency(50, 50) == pytest.approx(0.5)


def test_fit_recovers_the_model_it_was_made_from():
    s_min, b_noise = 31.0, 73.0
    points = [(b, pm.steps_to_target(b, s_min, b_noise)) for b in (8, 16, 32, 64, 128, 512)]
    assert pm.fit(points) == pytest.approx((s_min, b_noise), rel=1e-9)


def test_fit_of_the_measured_digits_curve():
    # steps to a training loss of 0.25 at batch 8..512, one process, tuned lr (the measurement)
    measured = [(8, 205), (16, 115), (32, 70), (64, 50), (128, 35), (256, 35), (512, 35)]
    s_min, b_noise = pm.fit(measured)
    assert s_min == pytest.approx(28, abs=1) and b_noise == pytest.approx(50, abs=2)
    for b, steps in measured:  # the fit misses batch 512 by 12.1%, every other point by less
        assert abs(pm.steps_to_target(b, s_min, b_noise) - steps) <= 0.13 * steps


def test_fit_refuses_what_is_not_the_model():
    with pytest.raises(ValueError, match="two or more"):
        pm.fit([(8, 10), (8, 12)])
    with pytest.raises(ValueError, match="do not follow"):
        pm.fit([(8, 10), (64, 50)])  # steps grow with the batch


def test_pays_to_the_target_exactly_when_it_is_sooner_than_one_process():
    # The calculator's verdict is never "pays" where its own time to the target is longer than R = 1's.
    rng = random.Random(0)
    for _ in range(300):
        t_comp, t_sync = rng.uniform(1e-4, 1e-1), rng.uniform(0, 1e-1)
        batch, b_noise = rng.choice([1, 8, 32, 256]), rng.uniform(0, 5000)
        points = pm.time_to_target(
            pm.Compute(t_comp, batch), pm.FixedSync(t_sync), [1, 2, 3, 8, 64], batch, b_noise, 10
        )
        one = points[0].seconds
        for p in points[1:]:
            assert p.pays == (p.seconds < one), (p, one)
            assert p.speedup_target == pytest.approx(one / p.seconds, rel=1e-9)


def test_without_noise_scale_effect_both_laws_agree_and_past_it_they_part():
    compute, sync = pm.Compute(0.0011, 32), pm.FixedSync(0.0002)
    huge = pm.time_to_target(compute, sync, [1, 2, 16], 32, b_noise=1e9)  # every batch is small
    for p in huge:
        assert p.speedup_target == pytest.approx(p.speedup_epoch, rel=1e-6)
    tiny = pm.time_to_target(compute, sync, [1, 2, 16], 32, b_noise=0.0)  # no noise: steps fixed
    assert [p.pays for p in tiny] == [False, False, False]  # more ranks only add T_sync
    assert all(p.pays_epoch for p in tiny[1:])


def test_strong_scaling_keeps_the_steps():
    pts = pm.time_to_target(pm.Compute(1.0, 64, t_fixed=0.1), pm.FixedSync(0.05), [1, 2, 4], 64, 50, mode="strong")
    assert [p.steps_ratio for p in pts] == [1.0, 1.0, 1.0]
    assert all(p.speedup_target == pytest.approx(p.speedup_epoch) for p in pts)


def test_best_ranks_and_batch():
    compute, sync = pm.Compute(0.0011, 32), pm.FixedSync(0.0002)
    points = pm.time_to_target(compute, sync, [1, 2, 4, 8, 16, 32], 32, 50)
    fastest = pm.best(points)
    assert fastest.speedup_target == max(p.speedup_target for p in points) or fastest.ranks < 32
    b, _ = pm.best_batch(compute, sync, 4, [8, 16, 32, 64], 50)
    assert b in (8, 16, 32, 64)
    # each row of the table carries the marker past the measured R
    rows = pm.target_rows(points, extrapolated=2)
    assert [r[0] for r in rows] == ["1", "2", "4*", "8*", "16*", "32*"]
    assert list(itertools.chain(rows))[0][-1] == "baseline"


def test_best_batch_needs_the_batch_its_compute_time_was_measured_at():
    with pytest.raises(ValueError, match="needs Compute\\(t_comp, batch\\)"):
        pm.best_batch(pm.Compute(1.0), pm.FixedSync(0.01), 4, [8, 16, 32], 10)  # else every batch costs the same
