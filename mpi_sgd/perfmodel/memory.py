"""Will it fit? Bytes of model state per rank under data parallelism and ZeRO stages 1-3.

Rajbhandari, Rasley, Ruwase & He, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020 (§5, Figure 1). A model of ``Ψ`` parameters trained with ``R``
data-parallel ranks holds three *model states*: parameters, gradients and optimizer state. With
``p``, ``g`` and ``k`` bytes of each per parameter, the bytes one rank holds are::

    stage 0, plain data parallel:          (p + g + k) · Ψ
    stage 1, optimizer state sharded:      (p + g) · Ψ  +  k · Ψ / R
    stage 2, + gradients sharded:           p · Ψ       + (g + k) · Ψ / R
    stage 3, + parameters sharded:                        (p + g + k) · Ψ / R

Which constants apply (:data:`PRECISIONS`, :data:`OPTIMIZERS`):

* ``fp32`` (what this project trains in): p = g = 4; k = 4 per optimizer-state element, so
  k = 8 for Adam (first and second moment), 4 for SGD with momentum, 0 for plain SGD.
* ``fp64``: every constant doubles.
* ``mixed``, the paper's own accounting: fp16 parameters and gradients (p = g = 2) plus an
  fp32 master copy of the parameters inside the optimizer state, so k = 4 + 4·(state
  elements): the paper's K = 12 for Adam. Its Figure 1 (Ψ = 7.5 B, R = 64: 120 GB, 31.4 GB,
  16.6 GB, 1.9 GB) follows from these lines; the unit tests check it.

Communication per rank per step, in elements (paper §7): plain data parallel all-reduces the
gradients, a reduce-scatter plus an all-gather of Ψ each: ``2Ψ``. Stages 1 and 2 move the same
(reduce-scatter the gradients, all-gather the updated parameters), stage 3 gathers every
parameter twice (forward and backward) besides the reduce-scatter: ``3Ψ``. A bandwidth-optimal
(ring) collective sends ``(R-1)/R`` of each of those volumes from every rank.

Activations, communication buffers and allocator slack are not model states and are not
counted: what fits by these formulas still needs room for them. Plain arithmetic: no MPI, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STAGES = (0, 1, 2, 3)
STAGE_NAMES = {0: "data parallel", 1: "ZeRO-1 (optimizer state)", 2: "ZeRO-2 (+ gradients)", 3: "ZeRO-3 (+ parameters)"}
# Optimizer-state elements per parameter.
OPTIMIZERS = {"sgd": 0, "momentum": 1, "adam": 2}
# name -> (parameter bytes, gradient bytes, bytes per optimizer-state element, master-copy bytes)
PRECISIONS = {"fp32": (4, 4, 4, 0), "fp64": (8, 8, 8, 0), "mixed": (2, 2, 4, 4)}
# Elements each rank moves per step (paper §7), as a multiple of Ψ.
COMM_VOLUME = {0: 2, 1: 2, 2: 2, 3: 3}


def _check(stage: int, ranks: int, optimizer: str, precision: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    if not (isinstance(ranks, int) and ranks >= 1):
        raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")


def constants(optimizer: str = "adam", precision: str = "fp32") -> tuple[int, int, int]:
    """(p, g, k): bytes of parameters, gradients and optimizer state per parameter."""
    _check(0, 1, optimizer, precision)
    p, g, per_state, master = PRECISIONS[precision]
    return p, g, master + per_state * OPTIMIZERS[optimizer]


@dataclass(frozen=True)
class ModelStates:
    """Bytes one rank holds of each model state: predicted here, measured by :mod:`mpi_sgd.zero.memory`."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def per_parameter(stage: int, ranks: int, optimizer: str = "adam", precision: str = "fp32") -> ModelStates:
    """Bytes per model parameter that one rank holds, by state (the formulas above with Ψ = 1)."""
    _check(stage, ranks, optimizer, precision)
    p, g, k = constants(optimizer, precision)
    shard = 1 / ranks
    return ModelStates(
        params=p * (shard if stage >= 3 else 1),
        grads=g * (shard if stage >= 2 else 1),
        optimizer=k * (shard if stage >= 1 else 1),
    )


def model_states(params: int, stage: int, ranks: int, optimizer: str = "adam", precision: str = "fp32") -> ModelStates:
    """Bytes of parameters, gradients and optimizer state on one rank for a model of ``params`` parameters."""
    if not (isinstance(params, int) and params >= 0):
        raise ValueError(f"params must be an integer >= 0, got {params!r}")
    each = per_parameter(stage, ranks, optimizer, precision)
    return ModelStates(each.params * params, each.grads * params, each.optimizer * params)


def largest_model(memory: float, stage: int, ranks: int, optimizer: str = "adam", precision: str = "fp32") -> int:
    """The most parameters whose model states fit in ``memory`` bytes per rank at this stage and R."""
    if not (isinstance(memory, (int, float)) and math.isfinite(memory) and memory >= 0):
        raise ValueError(f"memory must be a finite number of bytes >= 0, got {memory!r}")
    # Exact in integers: per-parameter bytes are a/R with integer a, so Ψ·a/R <= M iff Ψ·a <= M·R
    # (the float division alone can land one parameter off at the boundary).
    _check(stage, ranks, optimizer, precision)
    p, g, k = constants(optimizer, precision)
    sharded = {0: 0, 1: k, 2: g + k, 3: p + g + k}[stage]
    a = (p + g + k - sharded) * ranks + sharded  # bytes per parameter, times R
    return math.floor(memory) * ranks // a


def comm_elements(params: int, stage: int) -> int:
    """Elements each rank moves per step by the paper's count: 2Ψ (stages 0-2) or 3Ψ (stage 3)."""
    _check(stage, 1, "adam", "fp32")
    return COMM_VOLUME[stage] * params


def ring_bytes_sent(params: int, stage: int, ranks: int, bytes_per_element: int = 4) -> float:
    """Bytes each rank sends per step when every collective is bandwidth-optimal (a ring): (R-1)/R of the volume."""
    _check(stage, ranks, "adam", "fp32")
    return comm_elements(params, stage) * bytes_per_element * (ranks - 1) / ranks
