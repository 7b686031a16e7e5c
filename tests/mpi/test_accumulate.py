"""Gradient accumulation as a script spells it: k micro-batches per step on R ranks equal one process
at batch R*B, for every strategy and ZeRO stage, however the micro-batches are wrapped; and where a
spelling would send a micro-batch twice (``last=True`` on one that is not the last), it stops with
an error instead of training on a wrong sum.

Run at R = 1, 2 and 3 by ``make test`` (tests/mpi at 1 and 3, ``mpirun -n 2 pytest`` at 2).

Tolerance, in float64, as in test_sync_sgd.py: the distributed step and the reference add the same
per-sample gradients in another order (k micro-batch means per rank, then R ranks in whatever order
the all-reduce or reduce-scatter picks, against one mean over R*B), which moves each gradient by a
few ulps (2.2e-16); three steps of SGD with momentum at lr 0.05 carry that forward without growing
it. 1e-12 leaves four orders of margin above that, and is nine below what a real mistake gives: a
micro-batch counted twice or not at all, or the old default's second send (which adds an earlier
micro-batch's average R times over), moves a parameter by about lr * |g| ~ 1e-2 in the first step.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from mpi4py import MPI
from torch.nn import functional as F

from mpi_sgd import data, gradsync, zero
from mpi_sgd.bucketorder import SentTwice
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import MLP
from mpi_sgd.replicas import replicate
from mpi_sgd.step import make_optimizer

pytestmark = pytest.mark.mpi

RTOL = ATOL = 1e-12
K, B, STEPS = 3, 6, 3  # micro-batches per step, samples per rank per step (2 per micro-batch), steps
SIZES = (5, 7, 1)
SETTINGS = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9)
CASES = [(s, 0) for s in gradsync.STRATEGIES] + [("zero", stage) for stage in zero.STAGES]


@pytest.fixture(scope="module")
def comm():
    # A communicator of its own: the error case leaves no collective of it pending for other tests.
    return MPIComm(MPI.COMM_WORLD.Dup())


def dataset(R: int) -> data.Dataset:
    return data.toy_regression(num_samples=STEPS * R * B, input_size=SIZES[0], seed=4).to(torch.float64)


def build(comm, strategy: str, stage: int):
    model = replicate(lambda: MLP(SIZES).double(), comm, seed=0)
    if strategy == "zero":
        sync, optimizer = zero.make(stage, model, comm, lambda shards: make_optimizer(SETTINGS, shards))
    else:
        sync, optimizer = gradsync.make(strategy, model, comm, bucket_mb=1e-4), make_optimizer(SETTINGS, model)
    return model, sync, optimizer


def block(sync, spelling: str, i: int):
    """How micro-batch ``i`` of ``K`` is wrapped."""
    if spelling == "documented":
        return sync.accumulate(last=i == K - 1)
    if spelling == "default":  # the old trap: the same block around every micro-batch
        return sync.accumulate()
    if spelling == "bare":  # no block at all, backward after backward
        return contextlib.nullcontext()
    assert spelling == "last-everywhere"
    return sync.accumulate(last=True)


def train(comm, strategy: str, stage: int, spelling: str) -> torch.Tensor:
    ds = dataset(comm.size)
    model, sync, optimizer = build(comm, strategy, stage)
    batches = data.rank_batches(len(ds), comm.rank, comm.size, B, epoch=0, seed=0)
    for step in range(STEPS):
        x, y = ds.x[batches[step]], ds.y[batches[step]]
        sync.zero_grad()
        for i, (xm, ym) in enumerate(zip(x.chunk(K), y.chunk(K), strict=True)):
            with block(sync, spelling, i):
                # each micro-batch's mean over B/K samples, divided by K: they sum to the mean over B
                (F.mse_loss(model(xm), ym) * (sync.loss_scale / K)).backward()
        sync.wait()
        optimizer.step()
    every = sync.full_parameters() if strategy == "zero" else contextlib.nullcontext()
    with every:
        return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def reference(R: int) -> torch.Tensor:
    """One process, batch R*B, the same samples in the same steps, plain torch."""
    ds = dataset(R)
    torch.manual_seed(0)
    model = MLP(SIZES).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=SETTINGS.lr, momentum=SETTINGS.momentum)
    for step, idx in enumerate(data.global_batches(len(ds), R, B, epoch=0, seed=0)):
        if step == STEPS:
            break
        idx = idx.reshape(-1)  # all R*B samples of this global batch
        optimizer.zero_grad()
        F.mse_loss(model(ds.x[idx]), ds.y[idx]).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def refused(strategy: str, stage: int, spelling: str) -> bool:
    """Spellings that send a micro-batch twice: ``last=True`` before the last where backward sends
    (bucketed, ZeRO), and, under ZeRO 2-3, which reduce-scatter every micro-batch and complete them
    as its block ends, backward after backward with no block between."""
    sends = strategy == "bucketed" or strategy == "zero"
    return spelling == "last-everywhere" and sends or spelling == "bare" and stage >= 2


@pytest.mark.parametrize("spelling", ["documented", "default", "bare", "last-everywhere"])
@pytest.mark.parametrize(("strategy", "stage"), CASES, ids=[f"{s}{stage or ''}" for s, stage in CASES])
def test_micro_batches_equal_one_process_at_batch_RB_or_stop(comm, strategy, stage, spelling):
    if not refused(strategy, stage, spelling):
        torch.testing.assert_close(train(comm, strategy, stage, spelling), reference(comm.size), rtol=RTOL, atol=ATOL)
        return
    # The wrong spelling is refused on every rank at the first micro-batch sent twice, before any
    # parameter moves: nothing is trained on a wrong sum.
    ds = dataset(comm.size)
    model, sync, _ = build(comm, strategy, stage)
    idx = data.rank_batches(len(ds), comm.rank, comm.size, B, epoch=0, seed=0)[0]
    sync.zero_grad()
    with pytest.raises(SentTwice):
        for i, (xm, ym) in enumerate(zip(ds.x[idx].chunk(K), ds.y[idx].chunk(K), strict=True)):
            with block(sync, spelling, i):
                (F.mse_loss(model(xm), ym) * (sync.loss_scale / K)).backward()
    sync.wait()  # what the first micro-batch started completes: nothing is left in flight
