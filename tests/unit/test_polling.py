"""mpi_sgd.comm.polling: the long waits poll a request, spinning first and then sleeping, and give
up at their deadline with the request still pending. The MPI side (an ``ibarrier`` that completes
only once every rank has entered) is tests/mpi/test_collectives.py's."""

from __future__ import annotations

import time

import pytest

from mpi_sgd.comm import polling
from mpi_sgd.comm.polling import Backoff, wait_idle


class After:
    """A request that completes on its ``polls``-th test (never, for None)."""

    def __init__(self, polls: int | None):
        self.polls, self.tested = polls, 0

    def test(self) -> bool:
        self.tested += 1
        return self.polls is not None and self.tested >= self.polls


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(polling.time, "sleep", slept.append)
    return slept


def test_a_quick_answer_is_waited_for_without_sleeping(sleeps):
    request = After(50)
    assert wait_idle(request, 10, Backoff(spins=100))
    assert request.tested == 50 and sleeps == []


def test_sleeps_double_after_the_spins_up_to_the_cap(sleeps):
    request = After(3 + 6)
    assert wait_idle(request, 10, Backoff(spins=3, first=0.001, cap=0.005))
    assert sleeps == [0.001, 0.002, 0.004, 0.005, 0.005]  # after polls 4-8; the ninth poll completes it


def test_gives_up_at_the_deadline_with_the_request_pending():
    request = After(None)
    start = time.monotonic()
    assert not wait_idle(request, 0.05, Backoff(spins=10, first=0.001, cap=0.002))
    took = time.monotonic() - start
    # One sleep past the deadline at most; a bound loose enough for a busy host, far below a hang.
    assert 0.05 <= took < 2.0 and request.tested > 10


def test_reset_starts_the_spins_again(sleeps):
    backoff = Backoff(spins=2, first=0.001, cap=0.004)
    for _ in range(4):
        backoff.pause()
    backoff.reset()
    for _ in range(3):
        backoff.pause()
    assert sleeps == [0.001, 0.002, 0.001]
