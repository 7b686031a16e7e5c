"""torch.distributed over mpi4py: a process-group backend named ``"mpi4py"``.

::

    import mpi_sgd.comm.backends.torch_mpi4py  # registers the backend
    dist.init_process_group("mpi4py")  # under mpiexec: no MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE

after which ``dist.*``, ``DistributedDataParallel`` and ``ZeroRedundancyOptimizer`` run unchanged over
MPI, from a pip-installed torch (whose own ``"mpi"`` backend needs a source build). Importing the
module registers the backend and lets ``env://`` rendezvous through MPI (:mod:`.rendezvous`).

* **Zero-copy.** Every call hands MPI the tensors' own memory (address, byte length, datatype), as
  the mpi4py seam does. Lists of tensors that lie anywhere in memory (``dist.all_gather`` into
  separately allocated tensors, gather, scatter, all_to_all) go as one ``MPI_*v`` call whose
  displacements are the tensors' addresses relative to the lowest one, so they too are written in
  place. The one exception: ``reduce_scatter`` from a *list* whose tensors are not adjacent in
  memory copies them into one buffer first (MPI's reduce-scatter reads a single buffer).
* **Non-blocking.** Every call starts a non-blocking MPI operation and returns a torch ``Work``
  at once; ``async_op=False`` is torch calling ``wait()`` straight away. The progress threads of
  :mod:`.progress` complete the requests and the work's future; why threads, and what they cost,
  is explained there. DDP's buckets therefore overlap backward as they do over gloo or NCCL.
* **Groups.** The default group is a duplicate of ``MPI.COMM_WORLD`` (its messages never meet
  yours); ``dist.new_group(ranks, backend="mpi4py")`` is ``MPI_Comm_create_group`` over those ranks,
  called by the group's members only. torch's global ranks must be MPI's (they are under
  ``init_process_group("mpi4py")``; a mismatch is an error, not a wrong answer).
* **Ops.** sum, avg (a sum, then a division: MPI has no average), min, max, product, and the
  bitwise ops on integers; float16/bfloat16 as :mod:`.mpitypes` describes. ``PREMUL_SUM`` (NCCL's),
  lists of several tensors per call (the old one-process-many-GPUs form), sparse tensors and
  non-CPU tensors raise ``NotImplementedError`` naming the call.

Where it lives: this module registers the backend and makes each group's MPI communicator
(:func:`_create`); :mod:`.mpi4py_group` is the group, one method per torch call; :mod:`.mpi4py_checks`
what it refuses before communicating; :mod:`.mpi4py_work` and :mod:`.progress` the works torch
waits on and the threads that complete them.
"""

from __future__ import annotations

import torch.distributed as dist
from mpi4py import MPI

from . import rendezvous
from .mpi4py_group import NAME, MPI4PyProcessGroup

__all__ = ["NAME", "MPI4PyProcessGroup", "register"]


def _create(opts, _backend_options=None) -> MPI4PyProcessGroup:
    """``dist.Backend`` creator: the group over MPI_COMM_WORLD or over the ranks torch asks for."""
    world = MPI.COMM_WORLD
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    if dist.is_initialized() and dist.get_rank() != world.rank or len(ranks) > world.size:
        raise RuntimeError(
            f"mpi4py backend: torch's rank {dist.get_rank() if dist.is_initialized() else '?'} is not MPI's "
            f"{world.rank} (of {world.size}); start the job with mpiexec and init_process_group('mpi4py')"
        )
    if not opts.global_ranks_in_group and (opts.group_rank, opts.group_size) != (world.rank, world.size):
        raise RuntimeError(
            f"mpi4py backend: torch asked for rank {opts.group_rank} of {opts.group_size}, but MPI runs this "
            f"process as rank {world.rank} of {world.size}; launch with mpiexec -n {opts.group_size}"
        )
    if ranks == list(range(world.size)):
        comm = world.Dup()  # its own context: the group's messages never match the user's
    else:
        group = world.Get_group().Incl(ranks)
        comm = world.Create_group(group)  # collective over the members only, as torch calls it
        group.Free()
    if comm.Get_rank() != opts.group_rank:
        raise RuntimeError(f"mpi4py backend: group rank {comm.Get_rank()} but torch expects {opts.group_rank}")
    return MPI4PyProcessGroup(comm, opts.timeout)


def register() -> None:
    """Register the ``"mpi4py"`` backend with torch.distributed (done on import; idempotent)."""
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
    rendezvous.install()


register()
