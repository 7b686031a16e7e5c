"""Sharded data parallelism: ZeRO stages 1, 2 and 3 over the communicator seam.

Plain data parallelism keeps a full copy of every model state on every rank: parameters,
gradients and optimizer state, 16 bytes per parameter for Adam in fp32. ZeRO (Rajbhandari,
Rasley, Ruwase & He, SC 2020) keeps the data-parallel computation and shards the copies instead:
each of the R ranks owns 1/R of every state and gets the rest from the others when it needs it.

* **Stage 1** shards the optimizer state. Each rank receives the average of *its shard* of the
  gradient (a reduce-scatter), updates its shard of the parameters, and an all-gather brings
  every rank the whole updated model.
* **Stage 2** also shards the gradients: each unit's gradient is reduce-scattered as soon as
  backward has produced it, overlapping the rest of backward, and its full buffer freed.
* **Stage 3** also shards the parameters: a unit's parameters are all-gathered just before its
  forward and again before its backward, and freed after each; the next unit's all-gather is
  in flight while the current one computes.

Bytes per rank (fp32, Adam: 4 parameter + 4 gradient + 8 optimizer-state bytes per parameter):
16Ψ, 8Ψ + 8Ψ/R, 4Ψ + 12Ψ/R, 16Ψ/R for stages 0 (plain) to 3; communication per rank and step
2Ψ, 2Ψ, 2Ψ, 3Ψ elements. :mod:`mpi_sgd.perfmodel.memory` has the arithmetic; :mod:`.memory` measures.

A *unit* (:mod:`.units`) is one module's own parameters flattened into one buffer and padded to
R equal shards, so any parameter size works at any R. The training step is plain data parallel's,
step for step: the same samples, the same average gradient, the same element-wise update; the
tests hold the parameters equal to :mod:`mpi_sgd.gradsync`'s after several steps.

Use it where a gradient strategy and an optimizer would go::

    sync, optimizer = zero.make(2, model, comm, lambda shards: torch.optim.Adam(shards, lr=1e-3))
    Trainer(model, optimizer, sync, dataset, comm, cfg).train()
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .engine import STAGES, ZeroEngine
from .memory import MemoryTracker, measure
from .optim import ShardedOptimizer


def make(
    stage: int,
    model: nn.Module,
    comm,
    make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    events: list | None = None,
) -> tuple[ZeroEngine, ShardedOptimizer]:
    """The gradient strategy and the optimizer of ZeRO stage ``stage`` for ``model`` on ``comm``.

    ``model`` must be identical on every rank already (:func:`mpi_sgd.gradsync.broadcast_parameters`);
    ``make_optimizer`` builds a ``torch.optim`` optimizer over the list of shards it is given.
    """
    engine = ZeroEngine(model, comm, stage, events)
    return engine, ShardedOptimizer(engine, make_optimizer)


def track_memory(engine: ZeroEngine | None, model: nn.Module, optimizer) -> MemoryTracker:
    """A tracker of ``model``'s states; a ZeRO ``engine`` samples it at every event of a step."""
    tracker = MemoryTracker(lambda: measure(model, optimizer, engine))
    if engine is not None:
        engine.memory = tracker
    return tracker


__all__ = ["STAGES", "MemoryTracker", "ShardedOptimizer", "ZeroEngine", "make", "measure", "track_memory"]
