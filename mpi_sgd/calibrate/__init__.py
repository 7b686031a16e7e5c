"""Calibrate the performance model on the machine at hand: α, β, γ and T_comp, saved as JSON.

* **α, β** come from an all-reduce sweep through the communicator seam (the call the trainer
  makes), fitted by least squares to the α-β-γ cost of an algorithm (:mod:`mpi_sgd.perfmodel`;
  the fit in :mod:`.fit`). It needs at least two ranks: run under ``mpiexec``.
* **γ** comes from timing the reduction itself (``numpy.add`` into a buffer) on one rank. It
  must be measured apart: ring and Rabenseifner all-reduce move 2(p−1)/p·n bytes and reduce
  (p−1)/p·n at every p, so in their sweeps β and γ always appear in the ratio 2:1 and no fit
  can tell them apart.
* **T_comp** is one training step (forward, backward, SGD step) of a model on one batch, timed
  on every rank at once with each rank's share of the cores, as in training. The step is the
  trainer's own (:func:`mpi_sgd.trainer.train_step`, with gradients laid out as the chosen
  strategy lays them out), so T_comp is by construction the ``t_comp`` a training run reports.

:mod:`.measure` does the measuring, :mod:`.records` holds the results and their JSON file, and
:mod:`.run` calibrates from wherever it is called: under mpiexec every rank measures; as one
process it starts ``mpiexec -n 2 python -m mpi_sgd.calibrate`` and reads back what that saved.
"""

from .fit import SweepRefused, fit_line, fit_network
from .measure import calibrate, measure_allreduce, measure_gamma, measure_step, sweep_sizes
from .records import Calibration, StepTiming, SweepPoint
from .run import main, run_calibration

__all__ = [
    "Calibration",
    "StepTiming",
    "SweepPoint",
    "SweepRefused",
    "calibrate",
    "fit_line",
    "fit_network",
    "main",
    "measure_allreduce",
    "measure_gamma",
    "measure_step",
    "run_calibration",
    "sweep_sizes",
]
