"""The torch process groups of the communicators after the first: made the way ``dist.new_group`` needs.

Every :class:`~.torch_dist.TorchDistComm` after the first one in a process runs on a group of its
own from ``dist.new_group``. That call has rules which, broken, hang a job rather than fail it:

* **Order.** torch asks every process to create groups in the same order. A split creates the
  groups of all its parts on every rank of the communicator being split, in color order
  (:func:`make_groups`); a rank outside a part returns from that part's call at once, since the
  groups are made with ``use_local_synchronization`` (only their members meet).
* **Names.** A group's rendezvous keys in torch's store begin with its name. With local
  synchronisation torch names a group after its ranks and the number of groups the calling process
  already knows (``_hash_ranks_to_str`` in ``torch/distributed/distributed_c10d.py``). Ranks that
  took part in different numbers of earlier groups (a nested split, a part left out with color None)
  would name it differently, and each would wait for the others' keys until the timeout. So the
  ranks first compare how many groups each knows, and those that know fewer make groups of
  themselves alone until they all know as many (:func:`align_names`).
* **Rank order.** A group's ranks are numbered in the order of its list with ``sort_ranks=False``,
  so a key that reorders ranks works; a torch without that argument sorts them, and then a split
  must keep the ranks' order (``key`` = rank, the default).
* **torch's MPI backend** builds every group over ``MPI_COMM_WORLD``, a collective of every
  process, and cannot synchronise locally: its parts can only be cut from a communicator that spans
  every process torch knows, and then every rank takes part in every group's creation.
"""

from __future__ import annotations

import datetime
import inspect

import torch.distributed as dist

from ..base import CommError, Communicator

SORT_RANKS = "sort_ranks" in inspect.signature(dist.new_group).parameters


def groups_known() -> int:
    """How many groups this process's torch knows: what it names the next local group after."""
    return len(dist.distributed_c10d._world.pg_names)  # no public accessor; read only


def align_names(mpi: Communicator, torch_backend: str) -> None:
    """Make every rank of ``mpi`` know as many torch groups as the one that knows most (collective)."""
    most = max(mpi.allgather_obj(groups_known()))
    while groups_known() < most:
        dist.new_group([dist.get_rank()], backend=torch_backend, use_local_synchronization=True)


def make_groups(
    mpi: Communicator, torch_backend: str, parts: list[list[int]], timeout: datetime.timedelta
) -> list[dist.ProcessGroup | None]:
    """One torch group per part (torch ranks, in the order they take in it), made on every rank of
    ``mpi`` in the order given; returns each part's group where this process is in it, else None."""
    mine = dist.get_rank()
    ordered = {"sort_ranks": False} if SORT_RANKS else {}
    if not SORT_RANKS and any(part != sorted(part) for part in parts):
        raise CommError(
            "this torch numbers a group's ranks in ascending order only (its new_group has no sort_ranks): "
            "split with key=rank (the default), which keeps the order"
        )
    local = torch_backend != "mpi"
    if local:
        align_names(mpi, torch_backend)
    elif mpi.size != dist.get_world_size():
        raise CommError(
            "torch's MPI backend makes every group over MPI_COMM_WORLD, with every process: split the "
            "communicator that spans the world, or use the torch-mpi4py backend, whose groups are local"
        )
    sync = {"use_local_synchronization": True} if local else {}
    groups = []
    for part in parts:
        group = dist.new_group(part, timeout=timeout, backend=torch_backend, **sync, **ordered)
        groups.append(group if mine in part else None)
    return groups
