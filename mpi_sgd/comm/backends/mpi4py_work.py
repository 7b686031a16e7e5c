"""The torch ``Work`` of the ``"mpi4py"`` process group: one call's MPI requests, as torch waits on them.

torch hands every collective back to its caller as a ``Work``: ``wait()``, ``is_completed()`` and a
future that DDP chains its buckets on. :class:`MPIWork` is that over the MPI requests one call
started. It completes nothing itself: the threads of :mod:`.progress` (or, for a blocking call, the
caller's own thread through :meth:`~.progress.Progress.drive`) complete the requests and then
:meth:`~.progress.Progress.settle` the work, once; ``wait()`` only waits for that, under the lock
they share, and raises past its timeout naming the call and rank.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from mpi4py import MPI

INF = float("inf")


def overdue_error(name: str, seconds: float) -> RuntimeError:
    return RuntimeError(
        f"mpi4py backend: {name} did not complete within {seconds:g} s (did another rank fail, or call something else?)"
    )


class MPIWork(dist.distributed_c10d.Work):
    """A torch ``Work`` over MPI requests: ``wait()``, ``is_completed()``, ``get_future()``.

    ``result`` (the tensors the call wrote) becomes the future's value; ``finish`` runs once the
    requests are done and before anyone is told so; ``keep`` holds buffers MPI still reads or
    writes. The future is made only when asked for: a blocking call never needs one.
    """

    def __init__(
        self,
        name: str,
        requests: Sequence[MPI.Request],
        result: list,
        finish=None,
        keep=None,
        timeout_s: float = INF,
        caller_waits: bool = False,
        statuses: bool = False,
    ):
        super().__init__()
        self.name, self.requests, self._result = name, list(requests), result
        self._finish, self._keep = finish, keep
        self.statuses = [MPI.Status() for _ in self.requests] if statuses else None
        self.timeout_s, self.deadline = timeout_s, time.monotonic() + timeout_s
        # Who may complete the requests: None (not yet claimed), "waiter", "sweeper", or "caller" for
        # a blocking call, whose own thread polls them in wait() (torch calls it straight away).
        self.owner: str | None = "caller" if caller_waits else None
        self.progress = None  # the Progress (progress.py) that settles it, once submitted
        self.number = -1  # its place among the works submitted (the progress threads' trace)
        self.listed = False  # in the progress threads' pending list
        self.settling = self.done = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future | None = None

    # -- the torch Work interface ------------------------------------------------------------
    def wait(self, timeout=None) -> bool:
        """Block until done; past ``timeout`` (else the group's), raise naming the call and rank."""
        seconds = timeout.total_seconds() if timeout else self.timeout_s
        deadline = time.monotonic() + seconds
        if self.owner == "caller" and not self.done:
            self.progress.drive(self, deadline)
        with self.progress.lock:
            while not self.done:
                left = deadline - time.monotonic()
                if left <= 0 or not self.progress.done_cv.wait(None if left == INF else left):
                    if not self.done:
                        raise overdue_error(self.name, seconds)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self.done

    def is_success(self) -> bool:
        return self.done and self._error is None

    def exception(self):
        return self._error

    def get_future(self) -> torch.futures.Future:
        with self.progress.lock:
            made, fut = self._future is None, self._future
            if made:
                fut = self._future = torch.futures.Future()
            done = self.done
        if made and done:  # finished before anyone asked for the future
            self._complete_future(fut)
        return fut

    def _complete_future(self, fut: torch.futures.Future) -> None:
        if self._error is None:
            fut.set_result(self._result)
        else:
            fut.set_exception(self._error)

    def result(self) -> list:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        """For a receive from any source: who sent it."""
        self.wait()
        return self.statuses[0].Get_source()

    _source_rank = source_rank
