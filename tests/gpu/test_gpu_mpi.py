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


def test_host_buffers_beside_gpu_ones(gpu_comm):
    """The trainer's control messages (statistics, checksums, flags) live in host memory, and NCCL
    reduces device memory only: the seam moves them across and back (DeviceStagedComm)."""
    import numpy as np

    comm, _ = gpu_comm
    x = torch.from_numpy(rank_data(comm.rank, 1001, "float64"))
    comm.allreduce(x, "sum")
    assert not x.is_cuda
    assert_close(x, "sum", comm.size, 1001, "float64")
    a = rank_data(comm.rank, 17, "float32")
    comm.allreduce(a, "max")
    assert_close(torch.from_numpy(a), "max", comm.size, 17, "float32")
    flags = np.array([comm.rank], dtype=np.int64)
    everyone = np.zeros(comm.size, dtype=np.int64)
    comm.allgather(flags, everyone)
    assert everyone.tolist() == list(range(comm.size))


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)


def _batch(rank: int):
    g = torch.Generator().manual_seed(1 + rank)  # every rank its own batch, reproducible on the CPU
    return torch.randn(32, 64, generator=g), torch.randint(10, (32,), generator=g)


def test_a_bucketed_step_on_the_gpu_averages_every_ranks_gradient(gpu_comm):
    from mpi_sgd import gradsync

    comm, device = gpu_comm
    model = _model(device)
    gradsync.broadcast_parameters(model, comm)
    sync = gradsync.make("bucketed", model, comm, bucket_mb=0.01)  # several buckets in flight
    sync.zero_grad()
    x, y = (t.to(device) for t in _batch(comm.rank))
    (torch.nn.functional.cross_entropy(model(x), y) * sync.loss_scale).backward()
    sync.wait()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu()

    # The data-parallel reference: one CPU process, every rank's batch, gradients averaged.
    reference = _model("cpu")
    want = torch.zeros_like(got)
    for r in range(comm.size):
        reference.zero_grad()
        xr, yr = _batch(r)
        torch.nn.functional.cross_entropy(reference(xr), yr).backward()
        want += torch.cat([p.grad.reshape(-1) for p in reference.parameters()]) / comm.size
    # GPU and CPU kernels sum in different orders (float32, fan-in 64 and 256): a few ulps of the
    # largest gradient, far below what a missing rank or a wrong scale would change.
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6), (got - want).abs().max()

    everyone = torch.zeros(comm.size, got.numel(), device=device)
    comm.allgather(got.to(device), everyone)
    for r in range(comm.size):
        assert torch.equal(everyone[r], everyone[0])  # replicas step with identical gradients


@pytest.mark.parametrize("strategy", ("flat", "bucketed"))
def test_the_trainer_on_the_gpu_equals_one_cpu_process_at_batch_RB(gpu_comm, strategy):
    from mpi_sgd.trainer import Trainer
    from tests.helpers import flat_params, regression_set, train_config
    from tests.mpi.test_sync_sgd import reference

    comm, device = gpu_comm
    backend = next(name for name, made in _made.items() if made is comm)
    cfg = train_config(strategy=strategy, device=str(device), backend=backend)
    ds = regression_set(comm.size)
    trainer = Trainer.from_config(cfg, ds.to(torch.float64, device), comm)
    trainer.train()
    got = flat_params(trainer.model).cpu()
    # float64 on both sides; GPU kernels sum in another order than the CPU's: ~1e-16 relative per
    # operation, grown over 6 steps with momentum to far below this, while one wrong step is ~1e-2.
    torch.testing.assert_close(got, reference(comm.size, cfg, ds), rtol=1e-10, atol=1e-10)
