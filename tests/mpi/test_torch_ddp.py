"""torch DDP and ZeroRedundancyOptimizer over the ``"mpi4py"`` backend, against the project's trainer.

The same training (model, initial weights, every rank's batches, SGD with momentum, K steps across
an epoch boundary) is run three ways and the parameters compared at the end:

* the project's :class:`~mpi_sgd.trainer.Trainer`, bucketed all-reduce over the mpi4py seam;
* ``DistributedDataParallel`` over ``"mpi4py"``, with small buckets so several are in flight;
* ``DistributedDataParallel`` over ``"gloo"``, same buckets.

Why bit for bit, and where. DDP divides each gradient bucket by R and then sums over ranks; the
trainer multiplies the loss by 1/R before backward and then sums. With R a power of two both
scalings are exact (a change of exponent), so the gradients entering the sum are the same bits; and
with one or two ranks the sum itself has one order (``a + b == b + a``). So at R = 1, 2 the three
runs must agree exactly, in float32 and float64. From R = 3 on, MPI and gloo may associate the R
terms differently and 1/3 is not exact: a few ulps per step, which K = 6 steps at lr 0.05 keep at
the ulp level (float64 eps 2.2e-16, float32 1.2e-7). The tolerance allows 1e-12 (float64) and
1e-5 (float32): far above that, and far below what a real mistake (a missing division, a bucket
reduced twice or not at all, another rank's batch) produces, a difference of order lr·|g| ~ 1e-3.

ZeroRedundancyOptimizer shards the optimizer: each rank updates the parameters it owns with the
same SGD arithmetic and broadcasts them, so it must match plain DDP exactly, at any R.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

import mpi_sgd.comm.backends.torch_mpi4py  # noqa: F401 - registers the backend
from mpi_sgd import data, gradsync
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import build_model
from mpi_sgd.trainer import Trainer, make_optimizer

pytestmark = pytest.mark.mpi

STEPS, B = 6, 8
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


@pytest.fixture(scope="module")
def groups():
    if not dist.is_initialized():
        dist.init_process_group("mpi4py")
    return {"mpi4py": dist.new_group(backend="mpi4py"), "gloo": dist.new_group(backend="gloo")}


@pytest.fixture(scope="module")
def comm(initialised):
    return initialised


def config(dtype: torch.dtype) -> TrainConfig:
    return TrainConfig(
        model="ffnet",
        dataset="blobs",
        batch_size=B,
        lr=0.05,
        momentum=0.9,
        max_steps=STEPS,
        epochs=100,
        progress=False,
        bucket_mb=0.02,
        seed=3,
        dtype=str(dtype)[6:],
    )


def dataset(size: int, dtype: torch.dtype) -> data.Dataset:
    # 3 global batches per epoch at any R: the 6 steps cross an epoch boundary (a reshuffle).
    return data.blobs(num_samples=3 * size * B + 5, input_size=12, num_classes=4, seed=1).to(dtype)


def model_for(cfg: TrainConfig, ds: data.Dataset, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and in every run
    return build_model(cfg.model, tuple(ds.x.shape[1:]), ds.num_outputs).to(dtype)


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def trainer_run(comm, cfg, ds, dtype) -> torch.Tensor:
    model = model_for(cfg, ds, dtype)
    sync = gradsync.make("bucketed", model, comm, cfg.bucket_mb)
    Trainer(model, make_optimizer(cfg, model), sync, ds, comm, cfg).train()
    return flat(model)


def ddp_run(group, cfg, ds, dtype, zero: bool = False) -> torch.Tensor:
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    ddp = DistributedDataParallel(model_for(cfg, ds, dtype), process_group=group, bucket_cap_mb=0.01)
    if zero:
        opt = ZeroRedundancyOptimizer(
            ddp.parameters(), torch.optim.SGD, process_group=group, lr=cfg.lr, momentum=cfg.momentum
        )
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    step, epoch = 0, 0
    while step < cfg.max_steps:
        for idx in data.rank_batches(len(ds), rank, size, cfg.batch_size, epoch, cfg.seed):
            opt.zero_grad()
            F.cross_entropy(ddp(ds.x[idx]), ds.y[idx]).backward()
            opt.step()
            step += 1
            if step == cfg.max_steps:
                break
        epoch += 1
    return flat(ddp.module)


def same(a: torch.Tensor, b: torch.Tensor, exact: bool, what: str) -> None:
    if exact:
        assert torch.equal(a, b), f"{what}: max difference {(a - b).abs().max().item():.3g}, expected none"
    else:
        torch.testing.assert_close(a, b, rtol=TOL[a.dtype], atol=TOL[a.dtype], msg=what)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_ddp_matches_trainer_and_gloo(groups, comm, dtype):
    cfg, ds = config(dtype), dataset(comm.size, dtype)
    ours = ddp_run(groups["mpi4py"], cfg, ds, dtype)
    exact = comm.size <= 2
    same(ours, ddp_run(groups["gloo"], cfg, ds, dtype), exact, "DDP mpi4py vs DDP gloo")
    same(ours, trainer_run(comm, cfg, ds, dtype), exact, "DDP mpi4py vs the project's trainer")
    moved = (ours - flat(model_for(cfg, ds, dtype))).abs().max().item()
    assert moved > 1e-3, "training did not move the parameters: the comparison would prove nothing"


def test_zero_redundancy_optimizer_matches_ddp(groups, comm):
    cfg, ds = config(torch.float64), dataset(comm.size, torch.float64)
    plain = ddp_run(groups["mpi4py"], cfg, ds, torch.float64)
    same(ddp_run(groups["mpi4py"], cfg, ds, torch.float64, zero=True), plain, True, "ZeRO vs DDP over mpi4py")
