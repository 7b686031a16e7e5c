"""Cutting a model into pipeline stages: its layers in order, and where the cuts go.

A pipeline needs the model as a sequence: stage ``s`` runs layers ``[bounds[s], bounds[s+1])``
and hands its output to stage ``s+1``. :func:`layers_of` gives that sequence for an
``nn.Sequential`` and for the project's :class:`~mpi_sgd.models.MLP` (and so its subclasses FFNet
and SimpleNet), built from the model's own modules (the same parameter objects, so a stage trains
the model it came from). A "layer" is one linear map with the activation
that follows it: cuts fall between layers, where the activation is what travels.

Where to cut (:func:`partition`): each layer gets a cost, and the cuts minimise the cost of the
most expensive stage, since the slowest stage sets the pace of the whole pipeline. Costs are
``"layers"`` (one each: equal layer counts), ``"params"`` (parameter count, a proxy for both
compute and memory in dense layers) or ``"time"`` (forward + backward seconds of each layer,
measured on a sample micro-batch on the root and broadcast, so every rank cuts the same way).
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ..models import MLP

SPLITS = ("layers", "params", "time")


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The model as an ordered list of layers whose composition is ``model.forward``."""
    if isinstance(model, nn.Sequential):
        return list(model)
    if not isinstance(model, MLP):
        raise TypeError(
            f"cannot cut a {type(model).__name__} into pipeline stages: give an nn.Sequential, "
            "an MLP or an FFNet (a pipeline needs the model as a sequence of layers)"
        )
    # MLP.forward: flatten, then (linear, relu, dropout) per hidden layer, then the last linear
    *hidden, last = model.layers
    blocks = [nn.Sequential(lin, nn.ReLU(), model.dropout) for lin in hidden] + [last]
    return [nn.Sequential(nn.Flatten(), blocks[0]), *blocks[1:]]


def balance(costs: list[float], parts: int) -> list[int]:
    """Cut ``costs`` into ``parts`` contiguous, non-empty runs minimising the largest run's sum.

    Returns the ``parts + 1`` boundaries ``[0, ..., len(costs)]``. The classic linear-partition
    dynamic programme, O(parts * n^2): models here have tens of layers. Ties go to the earliest
    cut, so every rank computes the same answer from the same costs.
    """
    n = len(costs)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} layer(s) into {parts} non-empty stage(s)")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][j]: smallest possible largest-stage cost for the first j layers in k stages
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            for i in range(k - 1, j):
                worst = max(best[k - 1][i], prefix[j] - prefix[i])
                if worst < best[k][j]:
                    best[k][j], cut[k][j] = worst, i
    bounds = [n]
    for k in range(parts, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    return bounds[::-1]


def layer_costs(layers: list[nn.Module], by: str, sample: torch.Tensor | None = None, repeats: int = 5) -> list[float]:
    """One cost per layer (see the module docstring); ``"time"`` needs a ``sample`` input."""
    if by == "layers":
        return [1.0] * len(layers)
    if by == "params":
        return [float(sum(p.numel() for p in layer.parameters())) for layer in layers]
    if by != "time":
        raise ValueError(f"unknown split {by!r}; choose one of {', '.join(SPLITS)}")
    if sample is None:
        raise ValueError("split by time needs a sample micro-batch to time the layers on")
    costs, z = [], sample
    for layer in layers:
        x = z.detach().requires_grad_(z.is_floating_point())
        times = []
        for _ in range(repeats + 1):  # the first run pays for allocation: dropped
            t0 = time.perf_counter()
            z = layer(x)
            z.backward(torch.ones_like(z))
            times.append(time.perf_counter() - t0)
        layer.zero_grad(set_to_none=True)
        costs.append(statistics.median(times[1:]))
    return costs


def partition(layers: list[nn.Module], parts: int, by: str = "layers", sample=None, comm=None) -> list[int]:
    """Stage boundaries for ``layers`` over ``parts`` stages, the same on every rank.

    Only the ``"time"`` split measures anything, so only it needs ``comm``: the root's timings
    are broadcast, since timings taken on each rank would differ and so would the cuts.
    """
    if by == "time":
        if comm is None:
            raise ValueError("split by time needs the communicator, to agree on one set of timings")
        costs = comm.bcast_obj(layer_costs(layers, by, sample) if comm.is_root else None)
    else:
        costs = layer_costs(layers, by)
    return balance(costs, parts)


def stage_module(layers: list[nn.Module], bounds: list[int], stage: int) -> nn.Sequential:
    """The layers of ``stage`` as one module."""
    return nn.Sequential(*layers[bounds[stage] : bounds[stage + 1]])


def cut(model: nn.Module, comm, by: str = "layers", sample=None) -> tuple[nn.Sequential, list[int]]:
    """This rank's stage of ``model`` over ``comm.size`` stages, and the boundaries of all of them.

    Every rank builds the whole model (same seed, so the same weights) and keeps its slice; at
    world size 1 the one stage is the whole model.
    """
    layers = layers_of(model)
    bounds = partition(layers, comm.size, by, sample, comm)
    return stage_module(layers, bounds, comm.rank), bounds
