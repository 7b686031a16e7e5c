"""The gradient noise scale measured inside data-parallel steps agrees with the exact one.

At fixed parameters (SGD at learning rate 0: the steps run, nothing moves), each step of R ranks
at batch B yields McCandlish's two-batch estimate (mpi_sgd.noisescale). Its mean over many steps
must match tr(Σ)/|G|² computed exactly from every per-sample gradient of the data set
(torch.func.vmap), for each strategy, at R = 1 (micro-batches of --grad-accum), 2, 3 and 4.

Batches are drawn with replacement, so each is an independent sample of the data set, as the
estimator assumes. Tolerance, from the estimator's own spread: the steps are cut into BLOCKS
blocks, |G|² and tr Σ are estimated in each, and B_noise (the ratio of their means) must lie
within 4 of its standard errors (delta method over the blocks; plus 3% for the bias of a ratio of
means at this many steps) of the exact value. 4 standard errors fail by chance about once in
15,000 runs; a wrong batch size or a missing 1/R factor moves the estimate by a factor of 2 or
more, far outside.
"""

from __future__ import annotations

import math

import pytest
import torch
from mpi4py import MPI
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from mpi_sgd import data, gradsync, zero
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.models import MLP
from mpi_sgd.noisescale import NoiseProbe, noise_scale
from mpi_sgd.replicas import replicate
from mpi_sgd.step import train_step

pytestmark = pytest.mark.mpi

STEPS, BLOCKS, B = 400, 10, 8


@pytest.fixture(scope="module")
def comm():
    return MPIComm(MPI.COMM_WORLD.Dup())


@pytest.fixture(scope="module")
def digits():
    ds = data.digits().to(torch.float64)
    return ds.x, ds.y


def build(comm, strategy: str, stage: int):
    model = replicate(lambda: MLP((64, 32, 10)).double(), comm, seed=0)
    if strategy == "zero":
        return model, *zero.make(stage, model, comm, lambda shards: torch.optim.SGD(shards, lr=0.0))
    return model, gradsync.make(strategy, model, comm, bucket_mb=0.004), torch.optim.SGD(model.parameters(), lr=0.0)


def exact(model, x, y) -> float:
    """tr(Σ)/|G|² from every sample's own gradient: Σ the covariance of one sample's gradient."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    g = torch.cat([v.reshape(len(x), -1) for v in per_sample.values()], dim=1)
    mean = g.mean(0)
    trace = (g - mean).pow(2).sum(1).mean()
    return float(trace / mean.dot(mean))


@pytest.mark.parametrize(("strategy", "stage"), [("naive", 0), ("flat", 0), ("bucketed", 0), ("zero", 1), ("zero", 2)])
@pytest.mark.parametrize("accum", [1, 2])
def test_the_estimate_in_training_matches_every_per_sample_gradient(comm, digits, strategy, stage, accum):
    if comm.size == 1 and (accum == 1 or strategy == "zero"):
        pytest.skip("one process measures the noise scale between micro-batches: --grad-accum 2, no --zero")
    x, y = digits
    model, sync, optimizer = build(comm, strategy, stage)
    probe = sync.noise = NoiseProbe(B * accum, accum, comm.size, sum(p.numel() for p in sync.params), "cpu")
    g = torch.Generator().manual_seed(1 + comm.rank)  # every rank its own independent batches
    blocks = []
    for step in range(STEPS):
        idx = torch.randint(len(x), (B * accum,), generator=g)
        assert train_step(model, optimizer, sync, x[idx], y[idx], grad_accum=accum).finite
        if (step + 1) % (STEPS // BLOCKS) == 0:
            blocks.append(probe.sums.clone())
            probe.sums.zero_()
    sums = torch.stack(blocks)
    comm.allreduce(sums, "sum")
    blocks = [probe.read(s) for s in sums]
    g2 = torch.tensor([b["g2"] for b in blocks])
    trace = torch.tensor([b["trace"] for b in blocks])
    overall = float(trace.mean() / g2.mean())  # the ratio of the means, as over the whole run
    want = exact(model, x, y)
    # the ratio's standard error by the delta method: the spread of trace - ratio * g2 over blocks
    spread = float((trace - overall * g2).std() / g2.mean()) / math.sqrt(BLOCKS)
    assert abs(overall - want) <= 4 * spread + 0.03 * want, (overall, want, spread, probe.batches)


def test_estimators_are_unbiased_on_their_definition():
    # E|g_b|^2 = |G|^2 + tr(Sigma)/b: feed the expectations, get |G|^2 and tr(Sigma) back exactly.
    from mpi_sgd.noisescale import estimate

    g2, trace = 3.0, 120.0
    got = estimate(g2 + trace / 8, g2 + trace / 32, 8, 32)
    assert got == pytest.approx((g2, trace), rel=1e-12)
    assert noise_scale(*got) == pytest.approx(40.0, rel=1e-12)
