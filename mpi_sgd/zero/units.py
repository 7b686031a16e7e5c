"""A unit: the parameters one module owns, flattened into one buffer and cut into R equal shards.

Layout. The ``numel`` parameter elements of a unit sit one after another in ``full``, padded
with zeros to ``R·S`` elements, ``S = ceil(numel / R)``; rank ``r`` owns elements
``[r·S, (r+1)·S)``. Every shard has the same length, so a reduce-scatter and an all-gather
need no counts, at any ``numel`` and any ``R``: a unit of 7 elements at R = 3 pads to 9 and
every rank owns 3; a unit of 2 elements at R = 4 pads to 4 and ranks 2 and 3 own only padding.
Padding costs at most ``R - 1`` elements per unit. Its gradient is always zero, so whatever the
optimizer does to it never reaches a parameter (and stays zero for SGD and Adam alike).

Every model parameter becomes a view into ``full`` (``param.data``), and its gradient a view
into the unit's flat gradient buffer, so gathering into ``full`` updates the module in place and
backward accumulates straight into the buffer that is reduce-scattered, with no copies.

Freeing parameters (stage 3) releases the *storage* of ``full`` (``resize_(0)``) and keeps the
tensors: autograd saved references to the parameters in forward, and those references see the
values again once the storage is re-allocated and gathered before backward (the technique of
PyTorch FSDP, Zhao et al., VLDB 2023).
"""

from __future__ import annotations

import torch
from torch import nn


class Unit:
    """One module's parameters as a sharded flat buffer; see the module docstring for the layout."""

    def __init__(
        self, name: str, module: nn.Module, params: list[nn.Parameter], rank: int, size: int, separate_shard: bool
    ):
        dtypes = {(p.dtype, p.device) for p in params}
        if len(dtypes) != 1:
            raise ValueError(
                f"module {name!r} mixes parameter dtypes/devices {sorted(map(str, dtypes))}; one flat buffer holds one"
            )
        self.name, self.module, self.params, self.size = name, module, params, size
        self.dtype, self.device = params[0].dtype, params[0].device
        self.numel = sum(p.numel() for p in params)
        self.shard_numel = -(-self.numel // size)  # ceil
        self.padded = self.shard_numel * size
        self.full = torch.zeros(self.padded, dtype=self.dtype, device=self.device)
        self.offsets, offset = [], 0
        with torch.no_grad():
            for p in params:
                self.full[offset : offset + p.numel()].copy_(p.reshape(-1))
                p.data = self.full[offset : offset + p.numel()].view_as(p)
                self.offsets.append(offset)
                offset += p.numel()
        lo = rank * self.shard_numel
        # Stages 1-2 keep every parameter, so a rank's shard is simply its slice of ``full``.
        # Stage 3 frees ``full`` between uses, so the shard lives in a tensor of its own.
        own = self.full[lo : lo + self.shard_numel]
        self.shard = own.clone() if separate_shard else own
        self.grad: torch.Tensor | None = None  # flat gradient, every param.grad a view into it
        self.grad_shard = torch.zeros(self.shard_numel, dtype=self.dtype, device=self.device)
        # collectives in flight, kept by the engine
        self.gather = None  # (Request, start time) of an all-gather into ``full`` in flight
        self.reduce = None  # (Request, receive buffer, start time) of a reduce-scatter in flight

    def __repr__(self) -> str:
        return f"<Unit {self.name}: {self.numel} elements, shard {self.shard_numel}>"

    # -- parameters ---------------------------------------------------------------------
    @property
    def gathered(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0

    def free_params(self) -> None:
        self.full.untyped_storage().resize_(0)

    def alloc_params(self) -> None:
        self.full.untyped_storage().resize_(self.padded * self.full.element_size())

    def slots(self) -> torch.Tensor:
        """``full`` as ``(R, S)``: the receive buffer of an all-gather of the shards."""
        return self.full.view(self.size, self.shard_numel)

    # -- gradients ----------------------------------------------------------------------
    def alloc_grad(self) -> None:
        """A zeroed flat gradient with every ``param.grad`` a view of it (before backward reaches the unit)."""
        if self.grad is None:
            self.grad = torch.zeros(self.padded, dtype=self.dtype, device=self.device)
            for p, offset in zip(self.params, self.offsets, strict=True):
                p.grad = self.grad[offset : offset + p.numel()].view_as(p)

    def adopt_grad(self, p: nn.Parameter) -> None:
        """Make sure ``p.grad`` is its view in the flat gradient.

        Backward normally finds the views in place (allocated just before it reached the unit). If
        it did not, autograd made a tensor of its own, which is copied in here, once.
        """
        self.alloc_grad()
        i = next(i for i, q in enumerate(self.params) if q is p)
        view = self.grad[self.offsets[i] : self.offsets[i] + p.numel()].view_as(p)
        if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
            view.add_(p.grad)
            p.grad = view

    def free_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.grad = None

    # -- checkpoints: the unit's slice of a full (unsharded) state --------------------------
    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Per-parameter tensors (in this unit's order) as one padded flat tensor."""
        flat = torch.zeros(self.padded, dtype=tensors[0].dtype, device=self.device)
        for t, offset in zip(tensors, self.offsets, strict=True):
            flat[offset : offset + t.numel()].copy_(t.reshape(-1))
        return flat

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A padded flat tensor back into per-parameter tensors of the parameters' shapes (copies)."""
        return [flat[o : o + p.numel()].view(p.shape).clone() for p, o in zip(self.params, self.offsets, strict=True)]


def build_units(model: nn.Module, rank: int, size: int, separate_shard: bool) -> list[Unit]:
    """One unit per module that owns trainable parameters directly, in ``model.modules()`` order.

    That order is the order of ``model.parameters()``; for the sequential models here it is also
    the order forward runs the modules in, which the engine uses to prefetch.
    """
    units, owner = [], {}
    for name, module in model.named_modules(remove_duplicate=False):
        name = name or type(model).__name__
        params = [p for p in module.parameters(recurse=False) if p.requires_grad]
        for p in params:
            if id(p) in owner and owner[id(p)] != name:
                # Stage 3 frees a unit's parameters after its forward; another module using them
                # later would read freed memory. Refused for every stage, so switching is safe.
                raise ValueError(
                    f"modules {owner[id(p)]!r} and {name!r} share a parameter (tied weights); not supported"
                )
            owner[id(p)] = name
        if params and not any(u.module is module for u in units):
            units.append(Unit(name, module, params, rank, size, separate_shard))
    return units
