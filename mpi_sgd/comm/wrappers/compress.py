"""Gradient compression: all-reduce in 16 bits, keep the caller's dtype in memory.

:class:`CompressedComm` wraps a communicator. Its ``allreduce``/``iallreduce`` of a float32 or
float64 tensor cast it to float16 or bfloat16, all-reduce that (half or a quarter of the bytes on
the wire), and cast the result back into the caller's tensor; an average is a 16-bit sum divided
afterwards in the caller's dtype. Everything else passes through unchanged, so it can be handed to
a gradient strategy as its communicator: ``gradsync.make("bucketed", model, CompressedComm(comm,
torch.bfloat16))``.

Error bound. Per element, with ``u`` the unit roundoff of the 16-bit type (2^-11 for float16, 2^-8
for bfloat16) and x_1..x_R the ranks' values: rounding each x_r to 16 bits errs by at most
``u·|x_r|``, and the R-1 additions of the all-reduce, in whatever order MPI makes them, by at most
``(R-1)·u·Σ|x_r|`` to first order (Higham, *Accuracy and Stability*, §4.2); so

    |compressed sum - Σ x_r| <= γ_R·Σ|x_r|,   γ_R = R·u / (1 - R·u) ≈ R·u,

and for the average, γ_R·mean|x_r| (the division happens afterwards, in the caller's dtype),

plus float16's range limits: under 2^-14 its spacing is fixed at 2^-24, so each of the 2R-1
roundings may err by 2^-25 absolute instead, and values over 65504 become inf (a ``GradScaler``
then skips the step, as it does for any overflow). bfloat16 has float32's range, so only its
coarser ``u`` applies. :func:`error_bound` computes the bound; the tests hold the compressed
all-reduce to it.
"""

from __future__ import annotations

import torch

from ..base import Request
from .wrapper import CommWrapper

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def error_bound(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bound above for the *sum* of ``parts`` (one row per rank), elementwise."""
    ranks, u = parts.shape[0], UNIT_ROUNDOFF[dtype]
    subnormal = (2 * ranks - 1) * 2.0**-25 if dtype == torch.float16 else 0.0
    return ranks * u / (1 - ranks * u) * parts.double().abs().sum(0) + subnormal


class CompressedComm(CommWrapper):
    """``inner`` with floating all-reduces carried in ``dtype`` (float16 or bfloat16)."""

    def __init__(self, inner, dtype: torch.dtype):
        if dtype not in UNIT_ROUNDOFF:
            raise ValueError(f"compression needs float16 or bfloat16, got {dtype}")
        super().__init__(inner)
        self.dtype = dtype

    def _wire(self, buf):
        """The 16-bit copy to send, or None for what passes through (integers, already 16-bit)."""
        if isinstance(buf, torch.Tensor) and buf.is_floating_point() and buf.element_size() > 2:
            return buf.to(self.dtype)
        return None

    def allreduce(self, buf, op="sum"):
        wire = self._wire(buf)
        if wire is None:
            return self.inner.allreduce(buf, op)
        self.inner.allreduce(wire, "sum" if op == "avg" else op)
        self._back(wire, buf, op)
        return buf

    def iallreduce(self, buf, op="sum"):
        wire = self._wire(buf)
        if wire is None:
            return self.inner.iallreduce(buf, op)
        req = self.inner.iallreduce(wire, "sum" if op == "avg" else op)
        return Request(req, Request.wait, Request.test, lambda: self._back(wire, buf, op), keep=wire)

    def _back(self, wire, buf, op) -> None:
        buf.copy_(wire)
        if op == "avg":
            buf /= self.size
