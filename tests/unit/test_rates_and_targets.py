"""The learning-rate rules and the target, as arithmetic: no processes.

Exact comparisons where the rule is a formula of a few operations on floats (equal up to one
rounding: rel 1e-12); the schedule's shape checked at the points its definition names.
"""

from __future__ import annotations

import math

import pytest

from mpi_sgd.config import TrainConfig
from mpi_sgd.lrschedule import LRSchedule, parse_warmup, scale_factor
from mpi_sgd.target import Target, TimeToTarget


def test_scaling_rules():
    assert scale_factor("none", 256, 32) == 1.0
    assert scale_factor("linear", 256, 32) == 8.0
    assert scale_factor("sqrt", 256, 32) == pytest.approx(math.sqrt(8), rel=1e-12)


def test_warmup_rises_from_the_unscaled_rate_to_the_scaled_one():
    s = LRSchedule(lr=0.1, factor=4.0, warmup_steps=10, total_steps=100)
    rates = [s.next_rate() for _ in range(12)]
    assert rates[0] == 0.1  # Goyal et al.: the first step at eta, then equal steps up to k*eta
    assert rates[9] == pytest.approx(0.1 + 0.3 * 9 / 10, rel=1e-12)
    assert rates[10:] == [pytest.approx(0.4, rel=1e-12)] * 2
    assert all(a < b for a, b in zip(rates[:10], rates[1:10], strict=False))


def test_cosine_and_step_schedules():
    cos = LRSchedule(lr=1.0, total_steps=100, schedule="cosine")
    assert cos.rate_at(0) == 1.0 and cos.rate_at(50) == pytest.approx(0.5) and cos.rate_at(100) == pytest.approx(0.0)
    step = LRSchedule(lr=1.0, total_steps=100, schedule="step")
    assert [step.rate_at(t) for t in (0, 49, 50, 74, 75)] == pytest.approx([1, 1, 0.1, 0.1, 0.01])


def test_adascale_gain_between_one_and_the_scale():
    s = LRSchedule(lr=0.1, adascale=True, scale=8.0)
    assert s.gain() == 1.0  # no estimate yet
    s.observe(g2=1.0, trace=0.0, base_batch=32)  # no noise: a bigger batch buys nothing
    assert s.gain() == pytest.approx(1.0)
    s2 = LRSchedule(lr=0.1, adascale=True, scale=8.0)
    s2.observe(g2=1e-9, trace=1e3, base_batch=32)  # all noise: the bigger batch is worth S steps
    assert s2.gain() == pytest.approx(8.0, rel=1e-6)
    s3 = LRSchedule(lr=0.1, adascale=True, scale=4.0)
    s3.observe(g2=1.0, trace=32.0, base_batch=32)  # sigma^2 = mu^2: r = 2 / (1/4 + 1) = 1.6
    assert s3.gain() == pytest.approx(1.6, rel=1e-12)
    rate = s3.next_rate()
    assert rate == pytest.approx(0.16, rel=1e-12) and s3.tau == pytest.approx(1.6)


def test_schedule_state_round_trips():
    a = LRSchedule(lr=0.1, factor=2.0, warmup_steps=5, total_steps=50, schedule="cosine")
    for _ in range(7):
        a.next_rate()
    b = LRSchedule(lr=0.1, factor=2.0, warmup_steps=5, total_steps=50, schedule="cosine")
    b.load_state_dict(a.state_dict())
    assert [a.next_rate() for _ in range(5)] == [b.next_rate() for _ in range(5)]


@pytest.mark.parametrize(("text", "want"), [("0", (0, "steps")), ("500", (500, "steps")), ("2ep", (2, "epochs"))])
def test_warmup_spelling(text, want):
    assert parse_warmup(text) == want


@pytest.mark.parametrize("text", ["x", "-3", "1.5", "inf"])
def test_warmup_refused(text):
    with pytest.raises(ValueError, match="--warmup"):
        parse_warmup(text)


def test_target_reached_and_not():
    t = TimeToTarget(Target("val_accuracy", 0.9), global_batch=64, steps_per_epoch=25)
    assert not t.check(0.85, 25, 1.0, 0.5, 0.85)
    assert t.check(0.91, 40, 2.0, 0.3, 0.91)
    assert t.record["step"] == 40 and t.record["samples"] == 2560 and t.record["epochs"] == 1.6
    assert "reached val accuracy >= 0.9 after 40 steps" in TimeToTarget.line(t.summary(50, 3.0))
    loss = TimeToTarget(Target("val_loss", 0.1), 64, 25)
    loss.check(0.4, 25, 1.0, 0.4, None)
    missed = loss.summary(50, 2.0)
    assert missed["reached"] is False and missed["best"] == 0.4
    assert "not reached" in TimeToTarget.line(missed)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (dict(lr_scaling="cubic"), "--lr-scaling"),
        (dict(adascale=True, lr_scaling="linear"), "--adascale"),
        (dict(noise_scale=True, amp="fp16"), "fp16"),
        (dict(target_val_loss=0.1, target_val_accuracy=0.9), "one target"),
        (dict(target_val_loss=0.1, val_fraction=0.0), "--val-fraction"),
        (dict(eval_every=10), "--eval-every"),
        (dict(warmup="soon"), "--warmup"),
        (dict(target_val_accuracy=float("nan")), "finite"),
    ],
)
def test_bad_rates_and_targets_are_refused(flags, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**flags)


def test_noise_scale_at_one_process_needs_micro_batches():
    with pytest.raises(ValueError, match="--grad-accum 2"):
        TrainConfig(noise_scale=True).check_machine(1)
    TrainConfig(noise_scale=True, grad_accum=2, batch_size=32).check_machine(1)
    TrainConfig(noise_scale=True).check_machine(2)


def test_a_negative_estimate_gives_no_noise_scale():
    from mpi_sgd.noisescale import estimate, noise_scale

    g2, trace = estimate(1.0, 1.2, 32, 64)  # the big batch's norm above the small's: noise
    assert g2 > 0 > trace and noise_scale(g2, trace) is None
    assert noise_scale(2.0, 300.0) == 150.0


def test_adascale_says_where_its_schedule_stopped_short():
    from types import SimpleNamespace

    from mpi_sgd.convergence import Convergence

    s = LRSchedule(lr=0.1, adascale=True, scale=4.0, total_steps=400, schedule="cosine")
    s.g2, s.var = 1.0, 1.0  # gain (1 + 1)/(1/4 + 1) = 1.6 < S = 4
    for _ in range(100):
        s.next_rate()
    note = Convergence.unfinished(SimpleNamespace(schedule=s))
    assert note.startswith("AdaScale: the cosine schedule got to 160 of its 400 scale-invariant steps (the gain ")
    assert "averaged 1.60 of S = 4" in note
    s.tau = 400.0
    assert Convergence.unfinished(SimpleNamespace(schedule=s)) is None
