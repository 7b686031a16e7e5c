"""Server 0's gradient budget as a plain object: the orderings that timing decides in a real job.

In a job the order of "a worker's gradient applied", "a worker asks for more" and "a dead worker
noticed" depends on when messages arrive and when a timeout fires; here each ordering is played
out step by step, so the one that used to end a gradient short is reproduced every time.
"""

from __future__ import annotations

import random

import pytest

from mpi_sgd.paramserver.budget import Budget
from mpi_sgd.paramserver.protocol import HOLD, PARAMS, STOP


def run_up_to_the_last_grant(budget: Budget, survivor: int, doomed: int) -> None:
    """Both workers are granted a gradient; the survivor alone delivers until the budget is handed out."""
    assert budget.ask(survivor) == PARAMS and budget.ask(doomed) == PARAMS
    while budget.open:
        budget.apply(survivor)
        assert budget.ask(survivor) == PARAMS
    assert budget.granted == budget.evaluations and {survivor, doomed} <= budget.owed


def test_a_death_noticed_after_the_last_grant_holds_the_survivor_and_grants_it_the_returned_gradient():
    # The drill that used to end with 199 of 200: worker 3 dies owing a gradient; worker 2 takes the
    # last grant, delivers it and asks for more before the server notices worker 3 is gone.
    budget = Budget(200)
    run_up_to_the_last_grant(budget, survivor=2, doomed=3)
    budget.apply(2)
    assert budget.ask(2) == HOLD  # not STOP: worker 3 still owes one, and may never deliver it
    assert budget.settle() == []  # nothing has changed yet: it stays held
    assert budget.drop(3)  # the death is noticed: its gradient comes back ...
    assert budget.settle() == [(2, PARAMS)]  # ... and the held survivor computes it
    budget.apply(2)
    assert budget.ask(2) == STOP and budget.settle() == []
    assert budget.applied == 200 and not budget.owed and not budget.held


def test_a_death_noticed_before_the_last_grant_needs_no_hold():
    budget = Budget(10)
    assert budget.ask(2) == PARAMS and budget.ask(3) == PARAMS
    assert budget.drop(3) and budget.settle() == []
    while budget.open or budget.owed:
        budget.apply(2)
        answer = budget.ask(2)
        assert answer == (PARAMS if budget.applied < 10 else STOP)
    assert budget.applied == 10


def test_held_workers_stop_when_the_last_owed_gradient_is_delivered():
    # No death: worker 3 is merely slow. The held survivors stop once its gradient is applied.
    budget = Budget(50)
    assert budget.ask(4) == PARAMS
    run_up_to_the_last_grant(budget, survivor=2, doomed=3)
    budget.apply(2)
    assert budget.ask(2) == HOLD
    budget.apply(4)
    assert budget.ask(4) == HOLD and budget.settle() == []
    budget.apply(3)
    assert budget.ask(3) == STOP
    assert sorted(budget.settle()) == [(2, STOP), (4, STOP)]
    assert budget.applied == 50


def test_a_held_worker_that_is_lost_is_forgotten():
    budget = Budget(4)
    run_up_to_the_last_grant(budget, survivor=2, doomed=3)
    budget.apply(2)
    assert budget.ask(2) == HOLD
    assert not budget.drop(2)  # it owed nothing: no gradient comes back
    budget.apply(3)
    assert budget.ask(3) == STOP and budget.settle() == [] and budget.applied == 4


def test_asking_twice_without_delivering_is_a_bug():
    budget = Budget(3)
    budget.ask(2)
    with pytest.raises(ValueError, match="still owes"):
        budget.ask(2)


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_any_order_of_deliveries_and_deaths_applies_exactly_the_budget(workers):
    """Random interleavings: a computing worker delivers, or dies (all but one may die), at any
    moment, and its death is noticed at any later moment. Exactly ``evaluations`` gradients are
    applied, every survivor ends stopped, and the grants never exceed the budget."""
    for seed in range(200):
        rng, evaluations = random.Random(seed), 1 + seed % 40
        budget, alive, dead, stopped = Budget(evaluations), set(range(workers)), set(), set()
        for w in range(workers):
            if budget.ask(w) == STOP:  # more workers than gradients
                stopped.add(w)
        while budget.owed or budget.held:
            computing, unnoticed = sorted(budget.owed & alive), sorted(budget.owed & dead)
            event = rng.random()
            if computing and len(alive) > 1 and event < 0.05:
                w = rng.choice(computing)  # dies owing a gradient
                alive.discard(w)
                dead.add(w)
                continue
            if unnoticed and (event < 0.3 or not computing):
                budget.drop(rng.choice(unnoticed))  # its timeout fires
                answers = budget.settle()
            elif computing:
                w = rng.choice(computing)
                budget.apply(w)
                answers = [(w, budget.ask(w)), *budget.settle()]
            else:
                raise AssertionError(f"seed {seed}: workers held with no gradient owed by anyone")
            stopped |= {w for w, tag in answers if tag == STOP}
            assert budget.granted <= evaluations
        assert budget.applied == evaluations, f"seed {seed}"
        assert alive <= stopped, f"seed {seed}: a survivor was never stopped"
