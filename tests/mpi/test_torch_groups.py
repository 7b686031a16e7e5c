"""Each torch.distributed communicator runs on a process group of its own, never on one it happens
to find: two of them in one process (gloo over the world beside gloo over a part of it, or gloo
beside nccl on GPUs) each use their own group and their own backend.

Were a communicator to fall back on torch's default group, the sub-group's sums below would come
out as the world's (or its calls would wait for ranks that never make them), and nccl's group
would report gloo as its backend."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI

from mpi_sgd.comm.backends import backend_available
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.comm.backends.torch_dist import TorchDistComm
from mpi_sgd.comm.backends.torch_mpi4py import MPI4PyProcessGroup

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def pair(world):
    """gloo over the world, and gloo over a part of it: the first world - 1 ranks, and the last
    rank on its own (at one rank, the whole world twice). Sizes differ from two ranks on."""
    whole = TorchDistComm("gloo", world)
    first = world.rank < max(1, world.size - 1)
    part = TorchDistComm("gloo", MPIComm(world.comm.Split(int(first), key=world.rank)))
    return whole, part, first


def test_each_communicator_has_a_group_of_its_own(world, pair):
    whole, part, first = pair
    assert whole.group is not part.group
    assert part.group is not dist.group.WORLD  # torch's default group is the first communicator's at most
    assert dist.get_world_size(whole.group) == whole.size == world.size
    assert dist.get_world_size(part.group) == part.size == (max(1, world.size - 1) if first else 1)
    assert dist.get_backend(whole.group) == dist.get_backend(part.group) == "gloo"


def test_collectives_stay_inside_their_group(world, pair):
    whole, part, _ = pair
    members = part.allgather_obj(world.rank)  # the world ranks in my part, over mpi4py
    assert len(members) == part.size
    # rank r holds r + 1, so a sum tells which ranks took part
    x = torch.tensor([world.rank + 1.0])
    part.allreduce(x)
    assert x.item() == sum(r + 1 for r in members)
    y = torch.tensor([world.rank + 1.0])
    whole.allreduce(y)
    assert y.item() == world.size * (world.size + 1) / 2


def test_point_to_point_and_roots_use_the_groups_own_ranks(world, pair):
    _, part, _ = pair
    right, left = (part.rank + 1) % part.size, (part.rank - 1) % part.size
    got = torch.zeros(1)
    req = part.irecv(got, left, tag=7)
    part.send(torch.tensor([float(part.rank)]), right, tag=7)
    req.wait()
    assert got.item() == left
    root = part.size - 1  # the group's last rank, whatever its rank in the world
    b = torch.tensor([float(part.rank)])
    part.broadcast(b, root=root)
    assert b.item() == root
    slots = torch.zeros(part.size, 1)
    part.allgather(torch.tensor([float(world.rank)]), slots)
    assert slots.flatten().tolist() == [float(r) for r in part.allgather_obj(world.rank)]


@pytest.mark.skipif(
    not (backend_available("nccl") and torch.cuda.is_available() and torch.cuda.device_count() >= MPI.COMM_WORLD.size),
    reason="needs torch with NCCL and one GPU per rank",
)
def test_nccl_beside_gloo(world, pair):
    whole, _, _ = pair
    gpu = TorchDistComm("nccl", world)
    assert dist.get_backend(gpu.group) == "nccl" and dist.get_backend(whole.group) == "gloo"
    x = torch.full((4,), world.rank + 1.0, device=gpu.device)
    gpu.allreduce(x)
    y = torch.full((4,), world.rank + 1.0)
    whole.allreduce(y)
    assert x.cpu().tolist() == y.tolist() == [world.size * (world.size + 1) / 2] * 4


def test_the_mpi4py_torch_backend_on_a_part_of_the_world(world, pair):
    # torch-mpi4py over the same split as the gloo part: a group of its own, whose process group is
    # an MPI sub-communicator of exactly the part's ranks (MPI_Comm_create_group, members only).
    whole, part, first = pair
    ours = TorchDistComm("torch-mpi4py", MPIComm(world.comm.Split(int(first), key=world.rank)))
    assert ours.group not in (whole.group, part.group, dist.group.WORLD)
    assert dist.get_backend(ours.group) == "mpi4py"
    assert isinstance(ours.group, MPI4PyProcessGroup) and ours.group.comm.Get_size() == part.size
    x = torch.tensor([world.rank + 1.0])
    ours.allreduce(x, "avg")  # the backend's own average
    members = part.allgather_obj(world.rank)
    assert x.item() == pytest.approx(sum(r + 1 for r in members) / len(members), rel=1e-6)  # float32: one rounding
