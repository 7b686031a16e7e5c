"""The non-finite verdict read one step late, so that a GPU step never waits for the host.

Every step ends with a verdict: were every rank's loss and gradients finite (:mod:`.nonfinite`)? On
the CPU reading it costs nothing. On a GPU, reading it (``bool(tensor)``) makes the host wait for
every kernel queued so far, so the CPU loses its lead of queued work at every step: on a small
model that wait was a third of the step. With ``--nonfinite-verdict next-step`` (what ``auto``
picks on a GPU) the verdict stays on the device:

* Step N's verdict is a 0-dim bool tensor, ``ok``, the same on every rank (it is read from the
  reduced buffers). The optimizer, built fused, takes ``found_inf = 1 - ok`` and, where it is 1,
  leaves the parameters *and* its own state (momentum, Adam's moments and step count) untouched,
  on the device, as torch's ``GradScaler`` has it do. The step's loss and accuracy sums are
  multiplied by ``ok``: a skipped step logs nothing.
* ``ok`` is copied to pinned host memory without blocking, and an event marks the copy.
* Once step N+1 is queued, the host reads step N's verdict. The GPU is busy with N+1 by then, so
  the copy is long done and the read does not wait. A bad verdict is handled there, on every rank
  at once: the message names step N (skipped on the device), ``--on-nonfinite stop`` stops every
  rank after step N+1 (itself applied only if finite), ``skip`` counts step N and goes on.
* The last verdict is read before the epoch's figures are summed, before a checkpoint is written
  and before the held-out set is scored: one wait per epoch, none per step.

The same path runs on the CPU when asked for (``--nonfinite-verdict next-step``), which is how the
tests check its semantics without a GPU. What a late verdict cannot tell is whether a NaN in a sum
came from the wire or from an overflow: by the time it is read, the reduced buffers hold the next
step's gradients (the message says so). Whether each rank's own gradients were finite is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VERDICTS = ("auto", "now", "next-step")


def wanted(cfg, device_type: str) -> bool:
    """Whether this run reads its verdicts a step late: ``next-step``, or ``auto`` on a GPU where
    nothing else needs the verdict on the host at once (config refuses those mixes for ``next-step``)."""
    if cfg.nonfinite_verdict == "next-step":
        return True
    return cfg.nonfinite_verdict == "auto" and device_type != "cpu" and not late_conflicts(cfg)


def late_conflicts(cfg) -> str | None:
    """What needs each step's verdict on the host at once, or None."""
    if cfg.zero:
        return "--zero steps one optimizer per shard"
    if cfg.amp == "fp16":
        return "--amp fp16's loss scaler skips steps itself"
    if cfg.adascale or cfg.noise_scale:
        return "--adascale and --noise-scale fold each step's norms in on the host"
    return None


@dataclass
class Kept:
    """What :func:`mpi_sgd.nonfinite.diagnose` reads of a step gone by: its own sums, its losses."""

    sums: list
    loss_ok: bool
    loss_flag: torch.Tensor | None

    @property
    def local_finite(self) -> bool:
        flags = self.sums + ([self.loss_flag] if self.loss_flag is not None else [])
        return self.loss_ok and all(bool(torch.isfinite(f)) for f in flags)

    def reduced_has_nan(self) -> None:
        return None  # the reduced buffers hold the next step's gradients by now: not known


@dataclass
class Pending:
    """One step's verdict on its way to the host."""

    step: int  # counted from 1, as messages name steps
    epoch: int
    host: torch.Tensor  # the verdict's copy (pinned on a GPU)
    event: object  # marks the copy on a GPU; None on the CPU
    stats: torch.Tensor  # the step's (loss sum, correct, samples) before masking
    kept: Kept

    def finite(self) -> bool:
        if self.event is not None:
            self.event.synchronize()  # long done when read a step late
        return bool(self.host)

    @property
    def loss(self) -> float:
        return self.stats[0].item() / max(self.stats[2].item(), 1)


class LateVerdict:
    """The trainer's queue of one: :meth:`push` each step, :meth:`flush` where the host must know."""

    def __init__(self):
        self.pending: Pending | None = None

    def push(self, step: int, epoch: int, ok: torch.Tensor, stats: torch.Tensor, flag) -> Pending | None:
        """Keep step ``step``'s verdict; return the previous step's if it was bad (read without waiting)."""
        if ok.device.type == "cpu":
            host, event = ok, None
        else:
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            host.copy_(ok, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        kept = Kept(flag._sums, flag._loss_ok, flag._loss_flag)  # begin_step makes new ones, so these stay
        previous, self.pending = self.pending, Pending(step, epoch, host, event, stats, kept)
        return previous if previous is not None and not previous.finite() else None

    def flush(self) -> Pending | None:
        """Read the last verdict now (it may wait for the device); it, if it was bad."""
        last, self.pending = self.pending, None
        return last if last is not None and not last.finite() else None
