"""Waiting for a request without holding a core: poll, spinning at first, then sleeping.

A blocking MPI call waits by polling, on a core of its own: fine while the answer is microseconds
away, a waste when it is seconds away (a server busy with other workers, the root writing a
checkpoint), and worse where ranks share cores, because the spinning rank takes time from the
very rank it waits for. So the long waits poll a non-blocking request: a few hundred polls
back to back (a reply usually comes that fast), then a sleep between polls that doubles up to a
cap. Polling also drives MPI's progress engine, so nothing stalls between sleeps.
"""

from __future__ import annotations

import time


class Backoff:
    """Spin for the first ``spins`` polls, then sleep between polls, doubling from ``first`` up to ``cap`` seconds."""

    def __init__(self, spins: int = 500, first: float = 50e-6, cap: float = 500e-6):
        self.spins, self.first, self.cap = spins, first, cap
        self.reset()

    def reset(self) -> None:
        self._polls, self._sleep = 0, self.first

    def pause(self) -> None:
        self._polls += 1
        if self._polls > self.spins:
            time.sleep(self._sleep)
            self._sleep = min(self.cap, 2 * self._sleep)


def wait_idle(request, seconds: float = float("inf"), backoff: Backoff | None = None) -> bool:
    """Poll ``request`` (a :class:`~mpi_sgd.comm.base.Request`) until it completes (True) or
    ``seconds`` have passed (False: still pending), sleeping between polls."""
    backoff = backoff or Backoff()
    deadline = time.monotonic() + seconds
    while not request.test():
        if time.monotonic() > deadline:
            return False
        backoff.pause()
    return True
