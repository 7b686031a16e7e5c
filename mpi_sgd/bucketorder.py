"""The order gradient buckets start their collectives in: the same on every rank, whatever autograd does.

MPI requires every rank to start its collectives in the same order, and backward produces
gradients in an order of its own, not always the order the parameters are listed in. So each
bucket counts the gradients it still waits for, and the buckets start strictly in their index
order: one that is complete before its predecessors waits for them. The bucketed all-reduce
(:class:`mpi_sgd.gradsync.BucketedAllReduce`, whose buckets are groups of parameters) and the
ZeRO engine (:class:`mpi_sgd.zero.ZeroEngine`, whose buckets are units) both schedule through
:class:`BucketOrder`, as PyTorch DDP's reducer launches its buckets in index order (Li et al.,
VLDB 2020).

Pure bookkeeping: no communication, no torch. What "start" means is the caller's ``start``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class SentTwice(RuntimeError):
    """A gradient arrived for a bucket whose collective already started in this round."""


class BucketOrder:
    """Buckets ``0 .. len(sizes)-1``, bucket ``i`` complete after ``sizes[i]`` arrivals, started in index order.

    A round runs from one :meth:`reset` to the next (a training step, or one micro-batch of it).
    :meth:`arrive` counts one gradient of a bucket; :meth:`start_ready` calls ``start(i)`` for each
    bucket that may start now, in order; :meth:`flush` starts the rest (gradients that never came,
    as for parameters unused this step, still take part: every rank must make the same calls).
    """

    def __init__(self, sizes: Sequence[int], start: Callable[[int], None]):
        self.sizes = list(sizes)
        self._start = start
        self.pending = list(self.sizes)  # gradients each bucket still waits for this round
        self.next = 0  # the next bucket to start; buckets [0, next) have started this round

    def arrive(self, i: int) -> bool:
        """One more gradient of bucket ``i`` is ready; True if it was the bucket's last.

        Raises :class:`SentTwice` if bucket ``i`` started already this round: its collective went
        out without this gradient, so the result would be wrong, and nothing after could tell.
        """
        if i < self.next:
            raise SentTwice(f"bucket {i} got a gradient after its collective started in this round")
        self.pending[i] -= 1
        return self.pending[i] == 0

    def start_ready(self, force: bool = False) -> None:
        """Start, in index order, every bucket that is complete and follows only started ones (all with ``force``)."""
        while self.next < len(self.sizes) and (force or self.pending[self.next] == 0):
            i = self.next
            self.next += 1
            self._start(i)

    def flush(self) -> None:
        """Start every bucket not started yet, complete or not: the end of a round."""
        self.start_ready(force=True)

    @property
    def started(self) -> range:
        """The buckets started this round, in start order."""
        return range(self.next)

    def reset(self) -> None:
        """A new round: every bucket waits for all of its gradients again."""
        self.pending = list(self.sizes)
        self.next = 0
