"""Fitting α, β (and γ) by least squares to all-reduce timings.

The fit weights each point by 1/t (it minimises relative error): sizes span six orders of
magnitude, and an unweighted fit would let the largest messages decide α as well. Where the
sweep has them, β (and γ) come from the sizes within 64× of the largest and α from the smaller
ones: MPI switches protocol between the two ends, and the gradients that T_sync is about are
large messages.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..perfmodel import Network, allreduce_coefficients
from ..report import human_bytes
from .records import SweepPoint


class SweepRefused(ValueError):
    """The sweep's timings cannot give a network worth saving; the message says what to change."""


def _nonneg_lstsq(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """min ||a·x − t|| with x >= 0, by dropping negative components and refitting (3 unknowns at most).

    A negative latency or bandwidth is noise, not physics: on a fast shared-memory link α can
    be lost in the scatter of the small-message times.
    """
    active = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        x[active] = np.linalg.lstsq(a[:, active], t, rcond=None)[0]
        negative = [i for i in active if x[i] < 0]
        if not negative:
            return x
        active.remove(min(negative, key=lambda i: x[i]))


# Sizes within this factor of the largest decide the bandwidth terms (see fit_network).
LARGE_END = 64


def fit_network(points: Sequence[SweepPoint], gamma: float | None = None, name: str = "fitted") -> Network:
    """Least-squares α, β (and γ unless given) from all-reduce timings, each point's ``avg_s``.

    With ``gamma`` given, its share ``c·γ`` is subtracted and only α and β are fitted; with
    ``gamma=0`` β absorbs the reduction (an "effective β"). With ``gamma=None`` all three are
    fitted, which needs points whose β and γ coefficients are not proportional (recursive
    doubling beside the ring, say); otherwise this raises rather than return an arbitrary split.
    """
    if len(points) < 2:
        raise ValueError("need at least two sweep points to fit α and β")
    if any(p.ranks < 2 for p in points):
        raise ValueError("an all-reduce at one rank moves nothing: sweep at two or more ranks (mpiexec -n 2)")
    coef = [allreduce_coefficients(p.algorithm, p.nbytes, p.ranks) for p in points]
    t = np.array([p.avg_s for p in points], dtype=float)
    if np.any(t <= 0):
        raise ValueError("all-reduce times must be positive (was the sweep run at one rank?)")
    a = np.array([[c.latency, c.bandwidth, c.compute] for c in coef], dtype=float)
    if gamma is not None:
        t = t - gamma * a[:, 2]
        a = a[:, :2]
    if np.linalg.matrix_rank(a / a.max(axis=0).clip(min=1e-300)) < a.shape[1]:
        raise ValueError(
            "β and γ cannot be told apart from these points (their coefficients are "
            "proportional); measure γ with measure_gamma() and pass it, or pass gamma=0"
        )
    w = 1.0 / np.array([p.avg_s for p in points])  # relative error: every size counts
    x = _nonneg_lstsq(a * w[:, None], t * w)
    nbytes = np.array([p.nbytes for p in points])
    large = nbytes >= nbytes.max() / LARGE_END
    if large.sum() > a.shape[1] and (~large).any() and np.linalg.matrix_rank(a[large]) == a.shape[1]:
        # Bandwidth from the large end, latency from the small end. MPI changes protocol in
        # between (eager to rendezvous, another algorithm), and one straight line through six
        # decades of sizes follows the many small points: over TCP here it under-predicted
        # 4-16 MiB all-reduces by a third, the sizes where gradients are. So β (and γ) come
        # from the largest sizes alone, with an intercept of their own, and α from the rest.
        x = _nonneg_lstsq(a[large] * w[large, None], t[large] * w[large])
        rest = t[~large] - a[~large, 1:] @ x[1:]
        x[0] = max(0.0, float(np.median(rest / a[~large, 0])))
    alpha, beta = float(x[0]), float(x[1])
    if beta <= 0:
        # Every real link costs time per byte. A β of 0 means the sweep's largest messages were too
        # small to show it above the noise (a loaded machine, a short sweep), and a network saved
        # with it would price any model's gradients at α alone.
        raise SweepRefused(
            f"the all-reduces up to {human_bytes(int(nbytes.max()))} showed no cost per byte above the noise "
            "(β fitted to 0): sweep larger sizes (--max-bytes, 16 MiB by default) or measure on a quieter machine"
        )
    return Network(alpha, beta, float(x[2]) if gamma is None else gamma, name)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of y = a + b·x, weighted by 1/y like :func:`fit_network`."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    w = 1.0 / y
    a = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    c0, c1 = _nonneg_lstsq(a, y * w)
    return float(c0), float(c1)
