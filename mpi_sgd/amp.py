"""Mixed precision for the training step: autocast, and a gradient scaler for float16.

``--amp bf16`` runs forward and loss under ``torch.autocast`` in bfloat16: matrix products in 16
bits, reductions and the weights in float32. bfloat16 has float32's exponent range, so gradients
need no scaling. ``--amp fp16`` does the same in float16, whose range is narrow: small gradients
would underflow to zero, so the loss is multiplied by a large factor before backward and the
gradients divided by it before the optimizer step, the factor halving whenever a step produces
inf or NaN (which is then skipped) and growing while none do (``torch.amp.GradScaler``;
Micikevicius et al., "Mixed Precision Training", ICLR 2018).

With data parallelism the scaler needs nothing extra: it inspects the gradients after they were
averaged, which are the same on every rank, so every rank skips the same steps and keeps the
same factor.

A skip now and then is the scaler at work; a run of them is not. A loss that is not finite in the
forward pass (weights grown past float16's range, say) overflows at every factor, and the scaler
would halve its factor and skip every step for ever while the run reported NaN losses and exit
status 0. So each skip is counted (:attr:`MixedPrecision.overflows`, and how many in a row), and
the trainer stops once halving could no longer help: from the initial 2**16, 40 halvings reach
2**-24, float16's smallest step, below which every scaled gradient is zero.
"""

from __future__ import annotations

import contextlib

import torch

MODES = ("none", "bf16", "fp16")
HOPELESS_OVERFLOWS = 40  # skips in a row after which the factor is below any float16 gradient (see above)


class MixedPrecision:
    """The three places a step changes: around forward, at backward, at the optimizer step."""

    def __init__(self, mode: str, device_type: str):
        if mode not in MODES:
            raise ValueError(f"unknown --amp {mode!r}; choose one of {', '.join(MODES)}")
        self.mode, self.device_type = mode, device_type
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
        self.scaler = torch.amp.GradScaler(device_type) if mode == "fp16" else None
        self.overflows = self.overflows_in_a_row = 0  # steps the scaler skipped: in all, and lately

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step ``optimizer``; False if fp16's scaler skipped the step (a gradient was inf or NaN)."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()  # (a host read; GradScaler.step itself reads its verdict too)
        self.scaler.step(optimizer)  # unscales, and skips the step if any gradient is inf/NaN
        self.scaler.update()  # halves the factor after a skip, and only then
        stepped = self.scaler.get_scale() >= before
        self.overflows += not stepped
        self.overflows_in_a_row = 0 if stepped else self.overflows_in_a_row + 1
        return stepped

    def state_dict(self) -> dict:
        return {} if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
