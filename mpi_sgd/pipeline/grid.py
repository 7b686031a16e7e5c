"""Pipeline x data parallelism: a 2-D grid of ranks, ``stages`` wide and ``R / stages`` deep.

Rank ``r`` is stage ``r % stages`` of pipeline (data-parallel replica) ``r // stages``, so the
stages of one pipeline are neighbouring ranks. Two sub-communicators cut the world along the
grid's axes (``MPI_Comm_split``): ``pipe`` joins the stages of one replica (the
:class:`~mpi_sgd.pipeline.PipelineStage` runs over it, stage = its rank there) and ``data``
joins the copies of one stage across replicas. Each replica takes its own share of the global
batch; after its pipeline step, each stage averages its gradients over ``data``, and every
copy of the stage then takes the same step: the unsplit model's step on the global batch
(the mean over D*B samples is the mean of the D replicas' means over B).
"""

from __future__ import annotations


def grid(comm, stages: int):
    """``(pipe, data)`` communicators of this rank on a grid of ``stages`` x ``comm.size // stages``.

    Wrappers around ``comm`` (debug checks, say) wrap each of the two halves the same way, so what
    they add holds on the grid too.
    """
    if stages < 1 or comm.size % stages:
        raise ValueError(f"{comm.size} ranks cannot form pipelines of {stages} stages (stages must divide the size)")
    if comm.size == 1:
        return comm, comm
    from ..comm.backends.mpi import MPIComm
    from ..comm.wrappers.wrapper import CommWrapper

    wrappers, base = [], comm
    while isinstance(base, CommWrapper):
        wrappers.append(type(base))
        base = base.inner
    if not isinstance(base, MPIComm):
        raise TypeError(f"splitting a communicator needs the mpi4py backend, not {comm.backend}")
    replica, stage = divmod(comm.rank, stages)
    halves = [MPIComm(base.comm.Split(color=replica, key=stage)), MPIComm(base.comm.Split(color=stage, key=replica))]
    for wrap in reversed(wrappers):  # innermost first, as they were stacked
        try:
            halves = [wrap(half) for half in halves]
        except TypeError:
            raise TypeError(
                f"grid cannot rebuild a {wrap.__name__} around each half from the communicator alone: "
                "call grid on the unwrapped communicator and wrap pipe and data yourself"
            ) from None
    pipe, data = halves
    return pipe, data
