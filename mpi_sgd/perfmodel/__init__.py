"""When does synchronous data-parallel SGD pay? A first-order model, in seconds and bytes.

* :mod:`.scaling`: [S-SGD]'s law, ``T_epoch = N/(R·B)·(T_comp + T_sync)``, speedup and efficiency
  at each R, weak or strong scaling; distribution pays exactly when ``T_sync/T_comp < R − 1``.
* :mod:`.costs`: the α-β-γ cost of an all-reduce (ring, recursive doubling, Rabenseifner), which
  gives T_sync(R) from a network's latency and bandwidth and the gradients' size; presets for
  typical networks.
* :mod:`.goodput`: time to a target rather than per epoch: steps to a loss fall with the global
  batch only up to the gradient noise scale, S(B) = S_min·(1 + B_noise/B) (McCandlish et al.).
* :mod:`.table`: the table and plot the speedup calculator shows.

Everything here is plain arithmetic: no MPI, no torch. Measured per-step seconds (a trainer's
compute and communication time) plug straight into :class:`Compute` and :class:`FixedSync`;
:mod:`mpi_sgd.calibrate` measures α, β, γ and T_comp on the machine at hand.
"""

from .costs import (
    ALLREDUCE_ALGORITHMS,
    PRESETS,
    AllreduceSync,
    Coefficients,
    Network,
    allreduce_coefficients,
    rabenseifner_allreduce,
    recursive_doubling_allreduce,
    ring_allreduce,
)
from .goodput import (
    TARGET_HEADERS,
    TargetPoint,
    best,
    best_batch,
    fit,
    statistical_efficiency,
    steps_to_target,
    target_rows,
    time_to_target,
)
from .scaling import SCALINGS, Compute, FixedSync, ScalingPoint, scaling
from .table import TABLE_HEADERS, plot_scaling, plot_target, table_rows

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "PRESETS",
    "SCALINGS",
    "TABLE_HEADERS",
    "TARGET_HEADERS",
    "TargetPoint",
    "best",
    "best_batch",
    "fit",
    "plot_target",
    "statistical_efficiency",
    "steps_to_target",
    "target_rows",
    "time_to_target",
    "AllreduceSync",
    "Coefficients",
    "Compute",
    "FixedSync",
    "Network",
    "ScalingPoint",
    "allreduce_coefficients",
    "plot_scaling",
    "rabenseifner_allreduce",
    "recursive_doubling_allreduce",
    "ring_allreduce",
    "scaling",
    "table_rows",
]
