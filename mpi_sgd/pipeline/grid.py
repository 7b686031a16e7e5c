"""Pipeline x data parallelism: a 2-D grid of ranks, ``stages`` wide and ``R / stages`` deep.

Rank ``r`` is stage ``r % stages`` of pipeline (data-parallel replica) ``r // stages``, so the
stages of one pipeline are neighbouring ranks. Two sub-communicators cut the world along the
grid's axes (``comm.split``, by ``MPI_Comm_split``'s rule): ``pipe`` joins the stages of one replica (the
:class:`~mpi_sgd.pipeline.PipelineStage` runs over it, stage = its rank there) and ``data``
joins the copies of one stage across replicas. Each replica takes its own share of the global
batch; after its pipeline step, each stage averages its gradients over ``data``, and every
copy of the stage then takes the same step: the unsplit model's step on the global batch
(the mean over D*B samples is the mean of the D replicas' means over B).
"""

from __future__ import annotations


def grid(comm, stages: int):
    """``(pipe, data)`` communicators of this rank on a grid of ``stages`` x ``comm.size // stages``.

    Collective over ``comm``. Both are :meth:`~mpi_sgd.comm.base.Communicator.split` parts of it,
    so the wrappers around ``comm`` (debug checks, the watchdog, fault injection) wrap each of
    them with the same settings, and what they add holds on the grid too.
    """
    if stages < 1 or comm.size % stages:
        raise ValueError(f"{comm.size} ranks cannot form pipelines of {stages} stages (stages must divide the size)")
    replica, stage = divmod(comm.rank, stages)
    pipe = comm.split(color=replica, key=stage)
    data = comm.split(color=stage, key=replica)
    return pipe, data
