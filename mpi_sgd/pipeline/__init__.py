"""Pipeline parallelism over the communicator's point-to-point calls: GPipe and 1F1B.

The model is cut into ``R`` stages, one per rank (:mod:`.split`); each step's batch is cut into
``m`` micro-batches that flow forward through the stages and whose gradients flow back
(:mod:`.stage`), in the order a schedule gives (:mod:`.schedule`). The gradients each stage
accumulates are those of the unsplit model on the whole batch, so every rank stepping its own
optimizer on its own stage takes exactly the unsplit model's step.

    stage_module, bounds = cut(model, comm, by="params")
    stage = PipelineStage(comm, stage_module, F.cross_entropy, schedule="1f1b", micro_batches=4)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.1)
    loss = stage.forward_backward(x, y)   # x read on stage 0, y on the last stage
    optimizer.step()

Pipelines side by side, each a data-parallel replica of the others (:mod:`.grid`):

    pipe, data = grid(comm, stages=2)     # then the pipeline over pipe, gradients averaged over data
"""

from .grid import grid
from .schedule import SCHEDULES, Deadlock, Op, ideal_bubble, peak_in_flight, schedule, simulate
from .split import SPLITS, balance, cut, layers_of, partition, stage_module
from .stage import ActivationMeter, PipelineError, PipelineStage

__all__ = [
    "SCHEDULES",
    "SPLITS",
    "ActivationMeter",
    "Deadlock",
    "Op",
    "PipelineError",
    "PipelineStage",
    "balance",
    "cut",
    "grid",
    "ideal_bubble",
    "layers_of",
    "partition",
    "peak_in_flight",
    "schedule",
    "simulate",
    "stage_module",
]
