"""The update a server applies to its slice: SGD with momentum, as ``torch.optim.SGD`` makes it.

Operation for operation ``torch.optim.SGD(momentum=m)`` without dampening or Nesterov, in the form
its documentation gives (the learning rate outside the velocity, unlike Sutskever et al., 2013):

    v <- g                 (first step)
    v <- m·v + g           (later steps)
    θ <- θ − lr·v

so with one worker the arithmetic is exactly plain SGD's. Written out rather than borrowed: here
the learning rate changes with every gradient's staleness, and the server updates one flat slice,
not a model's parameter groups, so four lines of arithmetic say it more plainly than an optimizer.
"""

from __future__ import annotations

import torch


class MomentumSGD:
    """The update rule above on one flat tensor, with its own momentum buffer; ``momentum`` 0 is plain SGD."""

    def __init__(self, momentum: float):
        self.momentum = momentum
        self.velocity: torch.Tensor | None = None

    def step(self, param: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
        """``param`` moved by one step along ``grad``, in place."""
        if self.momentum:
            if self.velocity is None:
                self.velocity = grad.clone()
            else:
                self.velocity.mul_(self.momentum).add_(grad)
            grad = self.velocity
        param.add_(grad, alpha=-lr)
