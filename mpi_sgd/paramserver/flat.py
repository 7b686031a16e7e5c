"""A model's parameters and gradients as two flat buffers, and the slices the servers own.

Every parameter tensor becomes a view into one flat parameter buffer, and its ``.grad`` a view
into one flat gradient buffer, so a worker receives a server's slice of parameters straight into
the model and pushes a slice of its gradients straight from where backward left them: no copies,
no pickling, one message per server per direction.
"""

from __future__ import annotations

import torch
from torch import nn

from ..comm import split_counts
from ..comm.buffers import zeros


def flatten(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Make ``model``'s parameters and gradients views into two new flat buffers; return them.

    The parameters keep their values. Gradients accumulate into the flat buffer (autograd adds
    into an existing ``.grad`` in place), so zero it before each backward.
    """
    params = list(model.parameters())
    if not params:
        raise ValueError("the model has no parameters to train")
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        raise ValueError(f"all parameters must share one dtype to live in one buffer, got {sorted(map(str, dtypes))}")
    n = sum(p.numel() for p in params)
    flat_params = zeros(n, params[0].dtype, params[0].device)
    flat_grads = zeros(n, params[0].dtype, params[0].device)
    offset = 0
    with torch.no_grad():
        for p in params:
            size = p.numel()
            view = flat_params[offset : offset + size].view_as(p)
            view.copy_(p)
            p.data = view
            p.grad = flat_grads[offset : offset + size].view_as(p)
            offset += size
    return flat_params, flat_grads


def shards(n: int, servers: int) -> list[slice]:
    """The slice of a flat buffer of ``n`` elements that each server owns: even, contiguous."""
    out, start = [], 0
    for count in split_counts(n, servers):
        out.append(slice(start, start + count))
        start += count
    return out
