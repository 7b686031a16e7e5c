"""One training step on this rank: the step the trainer runs and every benchmark times; and its optimizer.

Kept apart from the :class:`~mpi_sgd.trainer.Trainer` loop so that benchmarks, calibration and
pipelines time exactly this code without the loop's bookkeeping (epochs, checkpoints, metrics).
:func:`evaluate` scores a model with the same loss, for the held-out set.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from . import optimizers
from .amp import MixedPrecision
from .config import TrainConfig
from .gradsync import GradSync
from .launch import JobError


class TrainingDiverged(JobError):
    """A loss or gradient is no longer a finite number: every later step would train on garbage."""


def make_optimizer(cfg: TrainConfig, model, fused: bool = False) -> torch.optim.Optimizer:
    """``cfg``'s optimizer over a model's parameters, or over a list of tensors (a sharded optimizer's shards).

    ``cfg.optimizer`` ``sgd`` (with ``cfg.momentum``) or ``adam``, at ``cfg.lr``: the trainer's, and
    every benchmark's and example's, which pass a :class:`TrainConfig` of the settings they want.
    ``fused``: torch's fused implementation, the one that can skip a step on the device (``found_inf``).
    The classes are torch's, minus their import of torch's compiler (:mod:`mpi_sgd.optimizers`).
    """
    params = model.parameters() if isinstance(model, torch.nn.Module) else model
    kind = {"fused": True} if fused else {}
    if cfg.optimizer == "adam":
        return optimizers.Adam(params, lr=cfg.lr, **kind)
    return optimizers.SGD(params, lr=cfg.lr, momentum=cfg.momentum, **kind)


@dataclass(frozen=True)
class Step:
    """What one optimizer step took, and the sums behind its loss and accuracy on this rank."""

    t_comp: float  # forward, backward and optimizer: everything but waiting for gradients
    t_sync: float  # blocked in gradient communication
    stats: torch.Tensor  # float64 (loss summed over samples, correct predictions, samples)
    finite: bool = True  # every rank's loss and gradients were finite; if not, the optimizer did not step
    verdict: torch.Tensor | None = None  # train_step(late=True): ``finite`` as a device tensor, not yet read
    raw_stats: torch.Tensor | None = None  # late: ``stats`` before a bad step's were zeroed
    overflowed: bool = False  # --amp fp16: the scaler skipped this step (on every rank alike)

    @property
    def seconds(self) -> float:
        return self.t_comp + self.t_sync


def train_step(
    model,
    optimizer,
    sync: GradSync,
    x: torch.Tensor,
    y: torch.Tensor,
    grad_accum: int = 1,
    amp: MixedPrecision | None = None,
    hook: Callable[[str], None] | None = None,
    late: bool = False,
) -> Step:
    """One optimizer step on this rank's batch: the step the trainer runs and every benchmark times.

    Cross-entropy for class indices, mean squared error for float targets. The batch is split into
    ``grad_accum`` micro-batches whose gradients accumulate; ``sync`` averages them over the ranks
    once, after the last (:class:`~mpi_sgd.gradsync.LocalGradients` where nothing is averaged).
    ``amp`` (:class:`~mpi_sgd.amp.MixedPrecision`) wraps forward, backward and the optimizer step
    for ``--amp``; None is full precision.

    A non-finite loss or gradient on any rank (see :meth:`GradSync.outgoing`) makes every rank
    return ``finite=False`` for the same step, with the optimizer not stepped: no rank trains on it.

    ``hook``, if given, is called with ``"averaged"`` once the gradients are averaged, before the
    optimizer step, and with ``"updated"`` after it: where ``bench zero`` samples memory and times
    the update, on this very step rather than a copy of it.

    ``late``: the verdict is not read here (:mod:`mpi_sgd.lateverdict`). The optimizer, which must
    be fused, skips a bad step on the device (``found_inf``), the stats come back zeroed for it, and
    ``Step.verdict`` holds the verdict for the caller to read later; ``finite`` says True.
    """
    amp = amp or MixedPrecision("none", x.device.type)
    classification, loss_fn = _loss_for(y)
    start = time.perf_counter()
    sync.seconds = 0.0
    sync.zero_grad()
    sync.begin_step()
    noise = getattr(sync, "noise", None)  # measuring the gradient noise scale (mpi_sgd.noisescale), or None
    if noise is not None:
        noise.begin_step()
    stats = torch.zeros(3, dtype=torch.float64, device=x.device)  # summed where the loss is: no copy per step
    for i, (xm, ym) in enumerate(zip(x.chunk(grad_accum), y.chunk(grad_accum), strict=True)):
        with sync.accumulate(last=i == grad_accum - 1):
            sync.where("forward")
            t0 = time.perf_counter()
            with amp.autocast():
                out = model(xm)
                loss = loss_fn(out, ym)
            t1 = time.perf_counter()
            sync.note_loss(loss)  # before the hooks send
            sync.where("backward")
            # mean over B/k samples, divided by k: the k micro-batches sum to the mean over B
            amp.backward(loss * (sync.loss_scale / grad_accum))
            sync.record("forward", t0, t1)
            sync.record("backward", t1, time.perf_counter())
        if noise is not None and i == 0:
            noise.first_micro_batch(sync.params)  # one process: the small batch is this micro-batch
        with torch.no_grad():
            stats[0] += loss.detach().double() * len(ym)
            if classification:
                stats[1] += (out.argmax(1) == ym).sum()
            stats[2] += len(ym)
    sync.wait()
    if noise is not None:
        noise.averaged(sync.averaged_part_sq())
    if hook is not None:
        hook("averaged")
    sync.where("optimizer")
    t0 = time.perf_counter()
    verdict = raw = None
    overflowed = False
    if late:  # no host wait: a bad step is skipped on the device (see mpi_sgd.lateverdict)
        finite, verdict = True, sync.finite_flag()
        optimizer.found_inf = (~verdict).to(torch.float32)  # as torch's GradScaler hands it over
        try:
            amp.step(optimizer)
        finally:
            del optimizer.found_inf
        raw = stats.clone()
        stats.mul_(verdict)
    else:
        finite = sync.finite()
        if finite:
            if noise is not None:
                noise.commit()
            overflowed = not amp.step(optimizer)  # fp16's scaler: skipped on every rank alike on overflow
    end = time.perf_counter()
    sync.record("optimizer", t0, end)
    if hook is not None:
        hook("updated")
    return Step(end - start - sync.seconds, sync.seconds, stats, finite, verdict, raw, overflowed)


def _loss_for(y: torch.Tensor):
    """(classification?, loss): cross-entropy for class indices, mean squared error for float targets."""
    classification = not y.dtype.is_floating_point
    return classification, F.cross_entropy if classification else F.mse_loss


@torch.no_grad()
def evaluate(model, x: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """float64 (loss summed over samples, correct predictions, samples) of ``model`` on ``x``, ``y``,
    dropout off, ``chunk`` samples at a time: the training step's loss and accuracy, on other data."""
    classification, loss_fn = _loss_for(y)
    stats = torch.zeros(3, dtype=torch.float64, device=x.device)
    training = model.training
    model.eval()
    for i in range(0, len(x), chunk):
        xc, yc = x[i : i + chunk], y[i : i + chunk]
        out = model(xc)
        stats[0] += loss_fn(out, yc).double() * len(yc)  # the mean, times samples
        if classification:
            stats[1] += (out.argmax(1) == yc).sum()
        stats[2] += len(yc)
    model.train(training)
    return stats
