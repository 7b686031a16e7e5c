"""Versions and staleness on one server: pure bookkeeping, no communication.

A server's **version** V counts the gradients it has applied. A worker computes on the
parameters of the version it was last sent, v; when its gradient is applied the server is at
version V >= v, and the gradient's **staleness** is

    tau = V - v        (0: computed on exactly the parameters it updates, as in plain SGD)

With W workers pushing in turn, tau hovers around W - 1: each of the others got one gradient in
since this one's parameters were sent.

**Bounded staleness** (``max_staleness`` s): no gradient is ever applied more than s versions
late. A server applies one gradient at a time, so of the W gradients outstanding (one per worker,
computing or waiting) the k-th oldest, computed on version v_k, can be applied at version
V + k at the earliest. The server therefore applies a push only if afterwards every outstanding
gradient can still make it in time::

    V' + k - v_(k) <= s   for every k,    V' = V + 1, v_(0) <= v_(1) <= ...

and holds it (its worker waits) otherwise. The oldest push is always applicable, so the slowest
worker is never held, nothing deadlocks, and tau <= s holds for every applied gradient. A round
of W gradients on one version already needs s >= W - 1 (s = W - 1 makes the workers take turns).
This is the stale synchronous parallel idea (Ho et al., "More Effective Distributed ML via a Stale
Synchronous Parallel Parameter Server", NIPS 2013) counted in versions instead of clocks.

**Staleness-aware learning rate**: Zhang, Gupta, Lian & Liu ("Staleness-aware Async-SGD for
Distributed Deep Learning", IJCAI 2016; arXiv 1511.05950, 2015) divide the learning rate of a
gradient by its staleness, so old gradients move the parameters less: lr / max(tau, 1) here
(they count staleness from 1; a fresh gradient keeps the full rate).
"""

from __future__ import annotations

from collections import Counter


def staleness_lr(lr: float, tau: int, by_staleness: bool) -> float:
    """The learning rate for a gradient ``tau`` versions late."""
    return lr / max(tau, 1) if by_staleness else lr


class Clock:
    """One server's version and the version each worker's outstanding gradient is computed on."""

    def __init__(self, max_staleness: int | None = None):
        self.version = 0
        self.max_staleness = max_staleness
        self.outstanding: dict[int, int] = {}  # worker -> version its current gradient is computed on

    def hand_out(self, worker: int) -> int:
        """The worker is sent the current parameters: its next gradient is computed on this version."""
        self.outstanding[worker] = self.version
        return self.version

    def retire(self, worker: int) -> None:
        """The worker computes no more (stopped, or lost): it no longer holds anyone up."""
        self.outstanding.pop(worker, None)

    def staleness(self, worker: int) -> int:
        return self.version - self.outstanding[worker]

    def may_apply(self, worker: int, continues: bool = True) -> bool:
        """Whether applying ``worker``'s gradient now keeps every outstanding one within the bound.

        ``continues``: the worker will be handed the new version and compute again (the server
        that decides when training ends knows; the others assume it does).
        """
        if self.max_staleness is None:
            return True
        after = self.version + 1
        versions = sorted(v for w, v in self.outstanding.items() if w != worker) + ([after] if continues else [])
        return all(after + k - v <= self.max_staleness for k, v in enumerate(versions))

    def apply(self, worker: int) -> int:
        """Count ``worker``'s gradient as applied; returns its staleness."""
        tau = self.staleness(worker)
        if self.max_staleness is not None and tau > self.max_staleness:
            raise AssertionError(f"staleness {tau} exceeds the bound {self.max_staleness}: may_apply was not asked")
        self.version += 1
        del self.outstanding[worker]
        return tau


def histogram_text(counts: Counter, width: int = 40) -> str:
    """Staleness counts as text bars, one line per tau from 0 to the largest seen."""
    if not counts:
        return "  (no gradients applied)"
    total, top = sum(counts.values()), max(counts.values())
    lines = []
    for tau in range(max(counts) + 1):
        n = counts.get(tau, 0)
        bar = "#" * max(1 if n else 0, round(width * n / top))
        lines.append(f"  tau {tau:3d}: {n:6d} {100 * n / total:5.1f}%  {bar}")
    return "\n".join(lines)


def mean(counts: Counter) -> float:
    total = sum(counts.values())
    return sum(t * n for t, n in counts.items()) / total if total else 0.0
