"""ZeRO stages 1-3 train exactly as plain data parallel does, at whatever size this runs at.

Run as ``mpiexec -n R python -m mpi4py -m pytest --with-mpi tests/mpi`` (R = 1, 2, 3 in ``make
test``; R = 4 from tests/integration/test_zero_script.py). The reference is the project's plain
data-parallel trainer: :class:`~mpi_sgd.trainer.Trainer` with bucketed all-reduce, which
tests/mpi/test_sync_sgd.py holds to one process at batch R*B.

Tolerance, in float64. Both runs take the same samples, the same 1/R loss scaling and the same
element-wise optimizer update; they differ only in how the R per-rank gradients are summed: an
all-reduce in one, a reduce-scatter in the other (and, with gradient accumulation, stages 2-3
sum each micro-batch across ranks and then the micro-batches, where plain data parallel does it
the other way round). MPI may associate the R terms differently in each, so a gradient element
can differ by a few ulps (float64 eps = 2.2e-16). SGD carries that forward unchanged; Adam
divides by sqrt(v) + eps and can magnify it where the ranks' contributions nearly cancel, which
these small problems do not hit. Measured over every test here at R = 2, 3, 4: at most 1.1e-16.
We allow 1e-12 (rtol and atol), four orders above that, and nine below what a real mistake (a
shard updated twice or not at all, padding leaking into a parameter, a stale gather, a missing
1/R) produces, of order lr * |g| ~ 1e-3 after the first step. Without accumulation at R <= 2
there is only one order of summation, and the parameters must agree bit for bit.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile

import pytest
import torch
from mpi4py import MPI
from torch import nn

from mpi_sgd import data, gradsync, zero
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.comm.wrappers.counting import CountingComm
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import build_model
from mpi_sgd.perfmodel import memory as memmodel
from mpi_sgd.replicas import replicate
from mpi_sgd.trainer import Trainer, make_optimizer
from tests.helpers import STEPS, B, assert_same_on_every_rank, regression_set, train_config

pytestmark = pytest.mark.mpi

RTOL = ATOL = 1e-12


@pytest.fixture(scope="module")
def comm():
    return MPIComm(MPI.COMM_WORLD)


class Tiny(nn.Module):
    """Units of 65, 6 and 2 elements: uneven at R = 2, 3, 4, and one smaller than R = 3 and 4."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(12, 5), nn.Linear(5, 1), nn.Linear(1, 1)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def build(comm, cfg: TrainConfig, ds: data.Dataset, stage: int, model=None) -> Trainer:
    """Plain data parallel (stage 0: bucketed all-reduce) or ZeRO ``stage``, in the same Trainer."""
    model = replicate(
        lambda: (model() if model else build_model(cfg.model, tuple(ds.x.shape[1:]), ds.num_outputs)).double(),
        comm,
        cfg.seed,
    )
    if stage == 0:
        sync, optimizer = gradsync.make("bucketed", model, comm, cfg.bucket_mb), make_optimizer(cfg, model)
    else:
        sync, optimizer = zero.make(stage, model, comm, lambda shards: make_optimizer(cfg, shards))
    return Trainer(model, optimizer, sync, ds, comm, cfg)


def params_of(trainer: Trainer) -> torch.Tensor:
    """The whole model as one flat tensor (ZeRO-3 gathers it for the moment: the step left it sharded)."""
    every = getattr(trainer.sync, "full_parameters", contextlib.nullcontext)
    with every():
        return torch.cat([p.detach().reshape(-1).clone() for p in trainer.model.parameters()])


def assert_equal_to_plain(comm, got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    if comm.size <= 2:
        assert torch.equal(got, want), "one order of summation: expected bit-identical parameters"
    assert_same_on_every_rank(comm, got)


_plain: dict = {}  # the plain data-parallel runs, each trained once per world size


def train(comm, cfg, ds, stage, model=None) -> torch.Tensor:
    key = (comm.size, cfg, model)
    if stage == 0 and key in _plain:
        return _plain[key]
    trainer = build(comm, cfg, ds, stage, model)
    trainer.train()
    if stage == 0:
        _plain[key] = params_of(trainer)
    return params_of(trainer)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("stage", zero.STAGES)
def test_equals_plain_data_parallel(comm, stage, optimizer):
    cfg = train_config(optimizer=optimizer, lr=0.01 if optimizer == "adam" else 0.05)
    ds = regression_set(comm.size)
    assert_equal_to_plain(comm, train(comm, cfg, ds, stage), train(comm, cfg, ds, 0))


@pytest.mark.parametrize("stage", zero.STAGES)
def test_uneven_shards_and_a_unit_smaller_than_R(comm, stage):
    cfg = train_config(optimizer="adam", lr=0.01)
    ds = regression_set(comm.size)
    assert_equal_to_plain(comm, train(comm, cfg, ds, stage, Tiny), train(comm, cfg, ds, 0, Tiny))


@pytest.mark.parametrize("stage", zero.STAGES)
def test_gradient_accumulation(comm, stage):
    cfg = train_config(grad_accum=4)
    ds = regression_set(comm.size)
    got, want = train(comm, cfg, ds, stage), train(comm, cfg, ds, 0)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)  # other order of sums (docstring)
    assert_same_on_every_rank(comm, got)


def shared_folder(comm) -> str:
    # One directory, made by the root: pytest's tmp_path is per process.
    return comm.bcast_obj(tempfile.mkdtemp(prefix="mpi-sgd-zero-") if comm.is_root else None)


@pytest.mark.parametrize("stage", zero.STAGES)
def test_resume_is_bit_exact(comm, stage):
    # Dropout (per-rank RNG streams), Adam state and a stop in the middle of an epoch.
    ds = data.blobs(num_samples=3 * comm.size * B + 3, input_size=16, num_classes=4, seed=2).to(torch.float64)
    folder = shared_folder(comm)
    path = os.path.join(folder, "ckpt.pt")
    cfg = train_config(model="simplenet", optimizer="adam", lr=0.01, max_steps=6)
    whole = build(comm, cfg, ds, stage)
    whole.train()
    first = build(
        comm, train_config(model="simplenet", optimizer="adam", lr=0.01, max_steps=4, checkpoint=path), ds, stage
    )
    first.train()
    second = build(comm, cfg, ds, stage)
    second.load_checkpoint(path)
    assert (second.step, second.epoch, second.step_in_epoch) == (4, 1, 1)
    second.train()
    assert torch.equal(params_of(second), params_of(whole))
    comm.barrier()
    if comm.is_root:
        shutil.rmtree(folder)


def test_resume_at_another_world_size_and_stage(comm):
    """A checkpoint written by ZeRO-3 at R ranks resumes on R' = R - 1 ranks (1 at R <= 2) under
    stages 1 and 2, each training exactly as plain data parallel resumed from it does."""
    folder = shared_folder(comm)
    path = os.path.join(folder, "ckpt.pt")
    build(
        comm, train_config(optimizer="adam", lr=0.01, max_steps=3, checkpoint=path), regression_set(comm.size), 3
    ).train()
    size = max(1, comm.size - 1)
    sub = comm.comm.Split(0 if comm.rank < size else MPI.UNDEFINED, comm.rank)
    if sub != MPI.COMM_NULL:
        small = MPIComm(sub)
        cfg = train_config(optimizer="adam", lr=0.01, max_steps=STEPS)
        ds = regression_set(comm.size)  # the data the checkpoint was trained on (a resume refuses other data)
        results = {}
        for stage in (0, 1, 2):
            trainer = build(small, cfg, ds, stage)
            trainer.load_checkpoint(path)
            assert trainer.step == 3
            trainer.train()
            results[stage] = params_of(trainer)
        for stage in (1, 2):
            torch.testing.assert_close(results[stage], results[0], rtol=RTOL, atol=ATOL)
        sub.Free()
    comm.barrier()
    if comm.is_root:
        shutil.rmtree(folder)


def per_unit(engine, f) -> int:
    return sum(f(u) for u in engine.units)


@pytest.mark.parametrize("stage", zero.STAGES)
def test_memory_and_communication_match_the_formulas(comm, stage):
    """Measured bytes per rank are the paper's formulas plus the padding, and the peak stays near them."""
    counting = CountingComm(comm)
    cfg = train_config(optimizer="adam", lr=0.01, max_steps=2)
    ds = regression_set(comm.size)
    trainer = build(counting, cfg, ds, stage)
    engine = trainer.sync
    tracker = zero.track_memory(engine, trainer.model, trainer.optimizer)
    trainer.train()  # the first step creates Adam's state; the second is the one we look at
    tracker.reset()
    counting.reset()
    trainer.cfg = train_config(optimizer="adam", lr=0.01, max_steps=3)
    trainer.train()
    at_step, peak = tracker.last, tracker.peak  # last sample: after the parameter all-gather
    e, R, units = 8, comm.size, len(engine.units)  # float64 elements
    psi = sum(u.numel for u in engine.units)
    padded = per_unit(engine, lambda u: u.padded)
    shards = per_unit(engine, lambda u: u.shard_numel)
    # exact accounting: full buffers (with padding) or shards; Adam's two moments of each shard, plus
    # one 'step' scalar per unit (a float32 0-d tensor, 4 bytes)
    want_params = (shards if stage == 3 else padded) * e
    want_grads = (padded if stage == 1 else 0) * e + shards * e
    want_optimizer = 2 * shards * e + 4 * units
    assert (at_step.params, at_step.grads, at_step.optimizer) == (want_params, want_grads, want_optimizer)
    formula = memmodel.model_states(psi, stage, R, "adam", "fp64")
    padding = (R - 1) * units * e  # at most R-1 elements per unit, per state
    assert 0 <= at_step.params - formula.params <= padding
    assert 0 <= at_step.grads - formula.grads - (shards * e if stage == 1 else 0) <= padding
    assert 0 <= at_step.optimizer - formula.optimizer <= 2 * padding + 4 * units
    # Peak within the step: no more than two units' full gradients (one reducing while the next
    # is produced) and, at stage 3, two units' full parameters (one computing, one prefetched).
    largest_two = sum(sorted(u.padded for u in engine.units)[-2:]) * e
    assert peak.grads <= at_step.grads + (largest_two if stage >= 2 else 0)
    assert peak.params <= at_step.params + (largest_two if stage == 3 else 0)
    if stage == 3:
        # within training each unit is freed after use (the samples above); once train() returns, the
        # trainer gathers them all for whoever uses the model next (test_zero_after_training.py)
        assert all(u.gathered for u in engine.units), "stage 3 left the trained model sharded"
    # Communication, per step: reduce-scatter of every unit, all-gather once (stages 1-2) or twice
    # (stage 3: before forward and before backward); 2 Psi or 3 Psi plus padding.
    gathers = 2 if stage == 3 else 1
    assert counting.bytes["reduce_scatter"] == padded * e and counting.bytes["allgather"] == gathers * padded * e
    # the epoch's loss statistics and, where ranks hold replicas (stages 1-2), the end-of-training
    # parameter checksum (mpi_sgd.agree); nothing else
    assert counting.calls["allreduce"] == (1 if stage == 3 else 2)
    volume = counting.bytes["reduce_scatter"] + counting.bytes["allgather"]
    assert 0 <= volume - memmodel.comm_elements(psi, stage) * e <= (1 + gathers) * padding
    assert math.isclose(counting.ring_bytes_sent(), (counting.volume()) * (R - 1) / R)


def test_ranks_with_different_models_are_refused_before_any_collective(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks to differ")
    torch.manual_seed(0)
    model = Tiny() if comm.rank == 0 else nn.Sequential(nn.Linear(12, 5), nn.Linear(5, 1))
    with pytest.raises(ValueError, match="rank 1 built other units than rank 0"):
        zero.make(2, model.double(), comm, lambda shards: torch.optim.SGD(shards, lr=0.1))
