"""The parameter server's pure parts: staleness bookkeeping, its bound, configuration, flat views."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from mpi_sgd.models import FFNet
from mpi_sgd.paramserver import AsyncConfig, histogram_text
from mpi_sgd.paramserver.flat import flatten, shards
from mpi_sgd.paramserver.staleness import Clock, mean, staleness_lr


def test_staleness_counts_versions_applied_since_the_parameters_were_sent():
    clock = Clock()
    for w in (1, 2, 3):
        clock.hand_out(w)  # all three compute on version 0
    assert [clock.apply(w) for w in (2, 1, 3)] == [0, 1, 2]
    assert clock.version == 3
    clock.hand_out(2)
    assert clock.apply(2) == 0


def simulate(workers: int, bound: int, pushes: int, seed: int) -> Counter:
    """A server and ``workers`` workers finishing their gradients in random order, as timing makes it.

    Each round one computing worker (picked at random, the slow ones rarely) pushes; the server then
    applies held pushes oldest first while the bound allows, exactly as the server loop does.
    """
    rng = random.Random(seed)
    clock, computing, pending, applied = Clock(bound), set(range(workers)), set(), Counter()
    speed = [rng.choice([1, 1, 1, 10]) for _ in range(workers)]  # some workers are stragglers
    for w in range(workers):
        clock.hand_out(w)
    while sum(applied.values()) < pushes:
        if computing:
            w = rng.choices(sorted(computing), [speed[v] for v in sorted(computing)])[0]
            computing.discard(w)
            pending.add(w)
        while True:
            ready = [w for _, w in sorted((clock.outstanding[w], w) for w in pending) if clock.may_apply(w)]
            if not ready:
                break
            w = ready[0]
            applied[clock.apply(w)] += 1
            pending.discard(w)
            clock.hand_out(w)
            computing.add(w)
        assert computing or not pending, "every worker is held: the bound deadlocked"
    return applied


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
@pytest.mark.parametrize("slack", [0, 1, 3])
def test_bounded_staleness_never_exceeds_the_bound_and_never_deadlocks(workers, slack):
    bound = workers - 1 + slack
    for seed in range(20):
        counts = simulate(workers, bound, 200, seed)
        assert max(counts) <= bound
    assert max(simulate(workers, None, 200, 0)) >= 0  # unbounded runs the same loop


def test_unbounded_staleness_grows_with_a_straggler_and_the_bound_caps_it():
    free = simulate(4, None, 400, seed=7)
    assert max(free) > 6  # the rare pushes of the slow workers come many versions late
    assert max(simulate(4, 3, 400, seed=7)) <= 3


def test_the_oldest_outstanding_gradient_can_always_be_applied():
    clock = Clock(2)
    for w in range(3):
        clock.hand_out(w)
    clock.apply(1)
    clock.hand_out(1)
    clock.apply(2)
    clock.hand_out(2)  # versions now: w0 on 0, w1 on 1, w2 on 2; server at 2
    assert not clock.may_apply(2)  # the newest would push w0 and w1 past the bound
    assert clock.may_apply(0) and clock.apply(0) == 2


def test_staleness_aware_learning_rate():
    assert staleness_lr(0.1, 0, True) == 0.1 and staleness_lr(0.1, 1, True) == 0.1
    assert staleness_lr(0.1, 4, True) == pytest.approx(0.025)
    assert staleness_lr(0.1, 4, False) == 0.1


def test_histogram_text_and_mean():
    counts = Counter({0: 10, 2: 30})
    text = histogram_text(counts, width=30)
    assert text.splitlines()[1].split() == ["tau", "1:", "0", "0.0%"]
    assert text.splitlines()[2].endswith("#" * 30)
    assert mean(counts) == pytest.approx(1.5)


@pytest.mark.parametrize(
    "kw, size, message",
    [
        ({"servers": 2}, 1, "needs at least 3 ranks"),
        ({"servers": 2}, 2, "needs at least 3 ranks"),
        ({"max_staleness": 1}, 4, "cannot be met by 3 workers"),
        ({"straggler_ms": 5, "straggler_rank": 0}, 3, "not a worker"),
    ],
)
def test_world_checks(kw, size, message):
    with pytest.raises(ValueError, match=message):
        AsyncConfig(**kw).check_world(size)


def test_one_process_is_server_and_worker():
    cfg = AsyncConfig(max_staleness=0, straggler_ms=5)
    cfg.check_world(1)  # one worker: tau is always 0, and the one rank is the straggler
    assert (cfg.workers(1), cfg.first_worker(1), cfg.straggler(1)) == (1, 0, 0)
    assert (cfg.workers(3), cfg.first_worker(3), cfg.straggler(3)) == (2, 1, 2)


def test_value_checks():
    with pytest.raises(ValueError, match="heartbeat"):
        AsyncConfig(heartbeat=5, server_timeout=5)
    with pytest.raises(ValueError, match="--evaluations"):
        AsyncConfig(evaluations=0)
    AsyncConfig(max_staleness=2).check_world(4)  # 3 workers taking turns: fine


def test_flatten_makes_views_that_keep_the_values():
    torch.manual_seed(0)
    model = FFNet(5, num_hl=1, hl_size=4, num_outputs=2)
    before = [p.detach().clone() for p in model.parameters()]
    params, grads = flatten(model)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    params[0] = 42.0  # the model sees writes to the flat buffer (a receive lands there)
    assert next(model.parameters()).reshape(-1)[0] == 42.0
    model(torch.randn(3, 5)).sum().backward()
    assert torch.equal(grads, torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    assert grads.abs().sum() > 0


def test_shards_cover_the_buffer_evenly():
    assert shards(10, 3) == [slice(0, 4), slice(4, 7), slice(7, 10)]
    assert shards(2, 3) == [slice(0, 1), slice(1, 2), slice(2, 2)]
