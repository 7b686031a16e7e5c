"""Non-finite values ride in the gradient all-reduce itself: every rank stops (or skips) at one step.

:class:`NonFiniteFlag` is the part of every gradient strategy (:class:`mpi_sgd.gradsync.GradSync`)
that decides whether a step may be applied. Each buffer a strategy sends passes :meth:`outgoing`
first; :meth:`finite` reads the verdict after the collective, the same on every rank. The slow
path after a bad step (:attr:`local_finite`, :meth:`reduced_has_nan`, gathered by :func:`diagnose`)
tells a rank's own non-finite gradients from a sum corrupted in transit or overflowed.
"""

from __future__ import annotations

import math

import torch

from .report import ranks_text


class NonFiniteFlag:
    """Mixed into GradSync; needs ``self.params`` (the parameters whose gradients are averaged)."""

    params: list

    def reset_nonfinite(self) -> None:
        """The state before any step; ``check_finite = False`` afterwards turns the check off."""
        self.check_finite = True  # see outgoing()
        self._loss_flag: torch.Tensor | None = None  # GPU: 0, or NaN once a loss of this step was not finite
        self._loss_ok = True  # CPU: every loss of this step was finite
        self._sums: list[torch.Tensor] = []  # this rank's gradient sums this step, taken before sending
        self._sent: list[torch.Tensor] | None = None  # what this step reduced; None outside a checked step
        self._reduced: list[torch.Tensor] = []  # what a step found non-finite reduced, for reduced_has_nan()

    def begin_step(self) -> None:
        """Start a checked step (:func:`mpi_sgd.trainer.train_step` does): :meth:`finite` ends it.
        Outside a checked step (code driving a strategy by hand) :meth:`outgoing` does nothing."""
        self._loss_flag, self._loss_ok, self._sums, self._reduced = None, True, [], []
        self._sent = [] if self.check_finite else None

    def note_loss(self, loss: torch.Tensor) -> None:
        """Before a micro-batch's backward: remember whether its loss is finite, for :meth:`outgoing`."""
        if self._sent is None:
            return
        if loss.device.type == "cpu":  # reading a CPU number costs nothing
            self._loss_ok = self._loss_ok and math.isfinite(loss.item())
        else:  # reading it would wait for the GPU: a flag tensor instead
            flag = loss.detach() * 0  # 0, or NaN: 0 * inf and 0 * NaN are NaN
            self._loss_flag = flag if self._loss_flag is None else self._loss_flag + flag

    def outgoing(
        self, buf: torch.Tensor, shards: int = 1, result: torch.Tensor | None = None, total: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Called by every strategy on each buffer just before it is all-reduced (or reduce-scattered
        in ``shards`` equal parts, the received part landing in ``result``).

        One sum of squares of the buffer tells whether this rank's gradients in it are finite (an inf
        or a NaN anywhere makes it non-finite), and whether their sum over the ranks can be: a plain
        sum would pass two ranks' finite -2e38 whose sum overflows to -inf in an element the verdict
        never reads, whereas a finite sum of squares bounds every element below 1.8e19 (float32),
        where no sum over any number of ranks overflows. If they are not, or a loss of this step was not (see
        :meth:`note_loss`), element 0 of the buffer (of each shard) becomes NaN. NaN survives any
        sum, so after the collective every rank finds NaN in element 0 of some result: all ranks
        reach the same verdict at the same step with no message of their own (the flag is folded
        into the collective; Megatron reduces a separate flag with MAX instead).

        Cost: the sum of squares (one ``dot``) reads the buffer once, as fast as a plain sum; the
        rest is kept to the fewest tensor calls, since on a
        small model each call's fixed cost (microseconds) adds up to more than the sum. On the CPU
        the sum is done when it returns, so its verdict is read as a number and element 0 written
        only when it is bad. On a GPU reading it would wait for the kernel, so element 0 gets one
        in-place add with ``alpha=0`` instead: +0 when the sum is finite (bits unchanged), NaN when
        not (0 * inf is NaN): no branch, no wait. The sums are kept: after a non-finite step they
        tell whether this rank's own gradients were to blame (:attr:`local_finite`), which the
        reduced sums cannot.
        """
        if self._sent is None:
            return buf
        # ``total``: the buffer's squared norm, or the noise scale's where it already took it (one
        # pass, not two). Values above 1.8e19 (float32) count as non-finite: at that size they
        # nearly are, and below it no sum over the ranks can overflow.
        total = _sum_of_squares(buf) if total is None else total
        self._sums.append(total)
        loss = self._loss_flag  # (the loss is on the gradients' device: one of these two is unused)
        if buf.device.type != "cpu":
            if loss is not None or not self._loss_ok:
                total = total + (loss if self._loss_ok else float("nan"))
            firsts = buf.view(-1)[:: buf.numel() // shards][:shards] if shards > 1 else buf.view(-1)[:1]
            firsts.add_(total, alpha=0)
        elif not (math.isfinite(total) and self._loss_ok and (loss is None or math.isfinite(loss))):
            buf.view(-1)[:: buf.numel() // shards][:shards] = float("nan")  # element 0 of every shard
        self._sent.append(buf if result is None else result)
        return buf

    def finite(self) -> bool:
        """After :meth:`wait`: whether every rank's loss and gradients were finite this step.

        The same answer on every rank, read from element 0 of each reduced buffer (one read of them
        all on a GPU). The other elements need no look: what each rank sent passed :meth:`outgoing`'s
        bound, so their sums are finite (data corrupted on the way is the replica check's to find).
        """
        sent, self._sent = self._sent, None
        if sent is None:
            return True
        if not sent:  # nothing was communicated (LocalGradients): this rank alone, the same cheap sums
            self._sums = [_sum_of_squares(p.grad) for p in self.params if p.grad is not None]
            return self.local_finite
        if sent[0].device.type == "cpu":
            ok = all(math.isfinite(_first(b)) for b in sent)
        else:
            ok = bool(torch.isfinite(torch.cat([b.view(-1)[:1] for b in sent])).all())
        if not ok:
            self._reduced = sent
        return ok

    def finite_flag(self) -> torch.Tensor:
        """:meth:`finite` without reading it: a 0-dim bool tensor on the gradients' device, the same
        on every rank, for a verdict read a step later (:mod:`mpi_sgd.lateverdict`)."""
        sent, self._sent = self._sent, None
        if sent is None:
            return torch.ones((), dtype=torch.bool)
        if sent:  # element 0 of each reduced buffer carries every rank's losses and sums
            return torch.isfinite(torch.cat([b.view(-1)[:1] for b in sent])).all()
        self._sums = [_sum_of_squares(p.grad) for p in self.params if p.grad is not None]  # nothing was communicated
        device = self.params[0].device
        ok = torch.isfinite(torch.stack(self._sums)).all() if self._sums else torch.ones((), dtype=torch.bool)
        if self._loss_flag is not None:
            ok = ok & torch.isfinite(self._loss_flag).all()
        return ok.to(device) & self._loss_ok

    @property
    def local_finite(self) -> bool:
        """After a step: whether this rank's own losses and gradients were finite, before sending.
        Reads every kept flag (a GPU waits): for the slow path after :meth:`finite` said no."""
        flags = self._sums + ([self._loss_flag] if self._loss_flag is not None else [])
        return self._loss_ok and all(bool(torch.isfinite(f)) for f in flags)

    def reduced_has_nan(self) -> bool:
        """After :meth:`finite` said no: whether the reduced gradients hold a NaN anywhere but the flag
        elements. A sum of finite numbers that overflows gives ±inf, not NaN; so when every rank's
        own gradients were finite, NaN there means the data was corrupted on the way."""
        return any(bool(torch.isnan(b.view(-1)[1:]).any()) for b in self._reduced)


def diagnose(comm, flag: NonFiniteFlag, loss: float, where: str) -> str:
    """After a step that :meth:`NonFiniteFlag.finite` rejected, on every rank (a collective): one line
    that says what went wrong ``where`` (e.g. "in step 7 (epoch 0)").

    Only on this rare path, each rank reports its loss, whether its own gradients were finite
    before they were sent, whether the reduced sum holds NaN, and what a fault-injecting wrapper
    did (a communicator's ``tampered``); :func:`describe` names the culprits from those reports.
    """
    mine = (loss, flag.local_finite, flag.reduced_has_nan(), getattr(comm, "tampered", None))
    return describe(comm.allgather_obj(mine), where)


def describe(everyone: list[tuple], where: str) -> str:
    """The ranks whose loss, then whose gradient, was not finite; else how the sum went bad.

    ``everyone[r]`` is rank r's ``(loss, own gradients finite, reduced sum holds NaN, tampered)``.
    A sum of finite numbers that overflows gives ±inf, never NaN: so NaN in the sum when every
    rank sent finite gradients means the data was corrupted on the way, and inf means the sum
    was too large to represent.
    """
    bad_loss = [r for r, (v, *_) in enumerate(everyone) if not math.isfinite(v)]
    bad_grad = [r for r, (v, ok, *_) in enumerate(everyone) if math.isfinite(v) and not ok]
    tampered = [(r, t) for r, (*_, t) in enumerate(everyone) if t]
    if bad_loss:
        return f"loss {everyone[bad_loss[0]][0]} {where} on {ranks_text(bad_loss)}"
    if bad_grad:
        return f"non-finite or exploding gradient {where} on {ranks_text(bad_grad)} (loss finite there)"
    own = "every rank's own gradient was finite before sending"
    if tampered:
        by = "; ".join(f"rank {r} ({t})" for r, t in tampered)
        return f"non-finite gradient {where}: corrupted in transit by {by}; {own}"
    if everyone[0][2] is None:  # read a step late (mpi_sgd.lateverdict): the sum is gone
        return (
            f"non-finite gradient {where}: the sum was not finite though {own}: corrupted in transit or too "
            "large to add up (a verdict read a step late keeps no copy of the sum to tell which)"
        )
    if everyone[0][2]:
        return (
            f"non-finite gradient {where}: the sum holds NaN though {own}: corrupted in transit (finite "
            "numbers overflow to inf, not NaN), and a sum cannot tell whose contribution was bad"
        )
    return f"non-finite gradient {where}: the sum overflowed to inf though {own} (too large to add up)"


def _sum_of_squares(t: torch.Tensor) -> torch.Tensor:
    """``(t * t).sum()`` in one pass and no temporary (a BLAS dot)."""
    v = t.reshape(-1)
    return torch.dot(v, v)


def _first(t: torch.Tensor) -> float:
    """Element 0 of a CPU tensor, read through numpy where it can be (a tensor call costs more)."""
    return t.numpy().flat[0] if t.dtype in (torch.float32, torch.float64) else t.view(-1)[0].item()
