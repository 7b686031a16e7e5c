"""GPU tensors through the seam, one rank per GPU, against one-process references.

* ``mpi4py``: device memory handed to MPI when the library is CUDA-aware, staged through pinned
  host buffers otherwise (``init`` chooses); results must be exact for data movement and within
  the usual ordering tolerance for sums (tests.helpers).
* ``nccl``: torch.distributed's NCCL behind the seam, on a group of its own.
"""

from __future__ import annotations

import pytest
import torch

from mpi_sgd import comm as mpicomm
from mpi_sgd.comm.gpu import local_device
from tests.helpers import assert_close, rank_data

pytestmark = pytest.mark.mpi
_made: dict = {}


@pytest.fixture(params=("mpi4py", "nccl"))
def gpu_comm(request):
    if request.param not in _made:
        _made[request.param] = mpicomm.init(request.param, abort_on_error=False)
    comm = _made[request.param]
    return comm, local_device("cuda", comm.local_rank, comm.local_size)


@pytest.mark.parametrize("op", ("sum", "avg", "max"))
def test_allreduce_on_the_gpu(gpu_comm, op):
    comm, device = gpu_comm
    x = torch.from_numpy(rank_data(comm.rank, 100_003, "float32")).to(device)
    comm.allreduce(x, op)
    assert x.is_cuda
    assert_close(x.cpu(), op, comm.size, 100_003, "float32")
    y = torch.from_numpy(rank_data(comm.rank, 1001, "float32")).to(device)
    comm.iallreduce(y, "sum").wait()
    assert_close(y.cpu(), "sum", comm.size, 1001, "float32")


def test_movement_on_the_gpu(gpu_comm):
    comm, device = gpu_comm
    root = comm.size - 1
    everyone = torch.stack([torch.from_numpy(rank_data(r, 7, "float32")) for r in range(comm.size)])
    x = everyone[comm.rank].clone().to(device)
    comm.broadcast(x, root)
    assert torch.equal(x.cpu(), everyone[root])
    got = torch.zeros(comm.size, 7, device=device)
    comm.allgather(everyone[comm.rank].clone().to(device), got)
    assert torch.equal(got.cpu(), everyone)


def test_a_bucketed_step_on_the_gpu_keeps_replicas_identical(gpu_comm):
    from mpi_sgd import gradsync

    comm, device = gpu_comm
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    gradsync.broadcast_parameters(model, comm)
    sync = gradsync.make("bucketed", model, comm, bucket_mb=0.01)
    torch.manual_seed(1 + comm.rank)  # every rank its own batch
    sync.zero_grad()
    x, y = torch.randn(32, 64, device=device), torch.randint(10, (32,), device=device)
    (torch.nn.functional.cross_entropy(model(x), y) * sync.loss_scale).backward()
    sync.wait()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    everyone = torch.zeros(comm.size, grads.numel(), device=device)
    comm.allgather(grads.contiguous(), everyone)
    for r in range(comm.size):
        assert torch.equal(everyone[r], everyone[0])
