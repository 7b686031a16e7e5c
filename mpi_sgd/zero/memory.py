"""Bytes of model state a rank actually holds: parameters, gradients, optimizer state, and the peak.

Measured on the tensors themselves: the bytes of every distinct storage behind the parameters,
the gradients and the optimizer state. A storage that several tensors view (a flat buffer and
the parameters inside it) counts once; a freed one (stage 3 between uses) counts zero. This is
what the formulas of :mod:`mpi_sgd.perfmodel.memory` predict, measured rather than computed, padding
and transient buffers included, and in the same record (:class:`~mpi_sgd.perfmodel.memory.ModelStates`)
so that the two compare field by field. Activations are not model state and are not counted.

:class:`MemoryTracker` samples at every event of a step (the engine calls it from each hook:
gathers, frees, gradient buffers allocated and released, reduce-scatters started and finished),
so its ``peak`` is the most the model states took at any moment of the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ..perfmodel.memory import ModelStates


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (``None`` entries skipped)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _state_tensors(optimizer) -> list[torch.Tensor]:
    return [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


def measure(model: torch.nn.Module, optimizer, engine=None) -> ModelStates:
    """Model states held now, in bytes: plain data parallel (``engine`` None) or a :class:`ZeroEngine`'s."""
    params = list(model.parameters())
    grads = [p.grad for p in params]
    if engine is not None:
        shard_params, shard_grads = engine.state_tensors()
        params += shard_params
        grads += shard_grads
    return ModelStates(storage_bytes(params), storage_bytes(grads), storage_bytes(_state_tensors(optimizer)))


class MemoryTracker:
    """Calls ``measure`` at every :meth:`sample`; keeps the last snapshot and the one of largest total."""

    def __init__(self, measure_now: Callable[[], ModelStates]):
        self.measure_now = measure_now
        self.last: ModelStates | None = None
        self.peak: ModelStates | None = None

    def sample(self) -> ModelStates:
        self.last = self.measure_now()
        if self.peak is None or self.last.total > self.peak.total:
            self.peak = self.last
        return self.last

    def reset(self) -> None:
        self.last = self.peak = None
