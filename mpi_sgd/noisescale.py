"""The gradient noise scale, measured during data-parallel training at (almost) no cost.

McCandlish et al. ("An Empirical Model of Large-Batch Training", 2018) define the simple noise
scale B_noise = tr(Σ) / |G|²: Σ the covariance of one sample's gradient, G the true gradient.
Training at a global batch B needs about S_min·(1 + B_noise/B) steps to a given loss, so B_noise
is the batch beyond which more ranks stop buying proportionally fewer steps (the critical batch).

A mean gradient over b samples has E|g_b|² = |G|² + tr(Σ)/b. Two batch sizes b_small < b_big give
the unbiased estimators of their Appendix A.1:

    |G|²  ≈ (b_big·|g_big|² − b_small·|g_small|²) / (b_big − b_small)
    tr Σ  ≈ (|g_small|² − |g_big|²) / (1/b_small − 1/b_big)

Data parallelism hands both over for free: each rank's own gradient, before it is averaged, is a
batch-B sample (b_small = B), and the averaged one a batch-R·B sample (b_big = R·B). The squared
norms are summed over steps and ranks and the estimators applied to their means, which is the
smoothing (the ratio of two noisy means, not the mean of noisy ratios, as the paper advises).

How each part is measured (:class:`NoiseProbe`, attached to a strategy as ``sync.noise``):

* the small batch: every buffer a strategy sends passes :meth:`GradSync.outgoing`, which hands
  it here before the collective; one dot product of it. A strategy that sends each micro-batch
  (ZeRO stages 2-3 with ``--grad-accum k``) sends k rounds of batch B/k: the rounds are counted
  from the elements sent, so b_small = B/rounds;
* the big batch: after the average, each rank squares 1/R of it (every R-th parameter; ZeRO's own
  shard), so the sum over ranks is |g_big|² for the price of 1/R of a pass;
* at R = 1 nothing is sent: the small batch is the first micro-batch of ``--grad-accum k``
  (b_small = B/k, its gradient read before the others accumulate onto it), the big one the step.

The sums ride in the trainer's per-epoch all-reduce (no message of their own); ``--adascale``,
which needs them every step, adds one all-reduce of four numbers per step.
"""

from __future__ import annotations

import math

import torch


def estimate(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """(|G|², tr Σ) from mean squared norms of gradients at batch ``b_small`` and ``b_big``."""
    if not b_big > b_small > 0:
        raise ValueError(f"need two batch sizes b_big > b_small > 0, got {b_small} and {b_big}")
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return g2, trace


def noise_scale(g2: float, trace: float) -> float | None:
    """B_noise = tr Σ / |G|²; None where |G|² or tr Σ is not positive (either estimate is still noise:
    a negative B_noise is no scale at all)."""
    return trace / g2 if g2 > 0 and trace > 0 and math.isfinite(trace) else None


class NoiseProbe:
    """Squared gradient norms of one rank, summed over the steps of an epoch (see the module).

    ``sums`` is float64 ``[Σ|g_small|², small samples, Σ (this rank's part of |g_big|²), big parts]``
    on the gradients' device, so a GPU never waits for it; sum it over ranks to read it.
    """

    def __init__(self, batch_size: int, grad_accum: int, world_size: int, numel: int, device):
        self.batch_size, self.grad_accum, self.world_size, self.numel = batch_size, grad_accum, world_size, numel
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)
        self.rounds = 1  # how many rounds of batch B/rounds the small batch came in (measured)
        self._step = torch.zeros(3, dtype=torch.float64, device=device)  # this step: small sum, samples, big
        self._sent = 0  # elements sent this step
        self._sq: list[torch.Tensor] = []  # each sent buffer's squared norm, this step
        self._scale = 1.0  # the strategy's loss scale, undone on them
        self.last = torch.zeros(4, dtype=torch.float64, device=device)  # the last committed step

    @property
    def source(self) -> str:
        """Which two batches the estimate compares, as the output says it."""
        if self.world_size == 1:
            return f"first micro-batch of {self.grad_accum} (B/{self.grad_accum}) vs the step (B)"
        return "each rank's own gradient (B) vs the average over ranks (R*B)"

    @property
    def batches(self) -> tuple[float, float]:
        """(b_small, b_big) in samples."""
        if self.world_size == 1:
            return self.batch_size / self.grad_accum, self.batch_size
        return self.batch_size / self.rounds, self.world_size * self.batch_size

    def begin_step(self) -> None:
        self._step.zero_()
        self._sent, self._sq, self._scale = 0, [], 1.0

    def sent(self, buf: torch.Tensor, loss_scale: float) -> torch.Tensor | None:
        """A buffer about to be all-reduced (or reduce-scattered), scaled by the strategy's ``loss_scale``:
        its squared norm, returned for the non-finite check to reuse (one pass over it, not two)."""
        if self.world_size == 1:  # one process: the small batch is a micro-batch (first_micro_batch)
            return None
        flat = buf.view(-1)
        sq = flat.dot(flat)
        self._sq.append(sq)  # summed once the step is averaged: one tensor call per buffer here
        self._scale = loss_scale
        self._sent += flat.numel()
        return sq

    def first_micro_batch(self, params) -> None:
        """R = 1: after the first micro-batch's backward, its gradient (mean over B/k, divided by k)."""
        if self.world_size > 1 or self.grad_accum == 1:
            return
        sq = sum(p.grad.reshape(-1).dot(p.grad.reshape(-1)).double() for p in params if p.grad is not None)
        self._step[0] += sq * self.grad_accum**2
        self._step[1] += 1

    def averaged(self, part_sq: torch.Tensor) -> None:
        """After the average: this rank's part of |g_big|² (the parts of all ranks sum to it)."""
        self._step[2] += part_sq
        if self._sq:
            self._step[0] += torch.stack(self._sq).double().sum() / self._scale**2
        if self.world_size > 1:
            self.rounds = max(1, round(self._sent / self.numel))
            # each round sent a batch-B/rounds gradient; they were summed, so undo the 1/rounds
            self._step[0] *= self.rounds**2 if self.rounds > 1 else 1
            self._step[1] += self.rounds

    def commit(self) -> None:
        """Add this step to the epoch's sums (a step left out as non-finite is not committed); its
        own four numbers stay in :attr:`last`, for a per-step reduction (AdaScale)."""
        self.last = torch.cat([self._step, self._step.new_tensor([1 / self.world_size])])
        self.sums += self.last

    def read(self, reduced: torch.Tensor | list[float]) -> dict:
        """The estimate from sums reduced over ranks: ``|G|²``, ``tr Σ``, ``B_noise`` and the batches."""
        small, samples, big, steps = (float(v) for v in reduced)
        b_small, b_big = self.batches
        row = {"b_small": b_small, "b_big": b_big, "g2": None, "trace": None, "b_noise": None}
        if samples and steps and b_big > b_small:
            g2, trace = estimate(small / samples, big / steps, b_small, b_big)
            row.update(g2=g2, trace=trace, b_noise=noise_scale(g2, trace))
        return row


def sliced_sq_norm(tensors, rank: int, size: int) -> torch.Tensor:
    """Σ|t|² over this rank's 1/``size`` of every tensor (elements ``[n·rank/size, n·(rank+1)/size)``):
    its part of a replicated total, the same share of the work on every rank."""
    total = torch.zeros((), dtype=torch.float64)
    for t in tensors:
        if t is None:  # no gradient this step
            continue
        flat = t.reshape(-1)  # (a copy only for a tensor laid out otherwise, channels_last say)
        seg = flat[flat.numel() * rank // size : flat.numel() * (rank + 1) // size]
        total = total.to(seg.device) + seg.dot(seg).double()
    return total
