"""Synchronous SGD on R ranks equals one process at batch R*B, at whatever size this runs at.

Run as ``mpiexec -n R python -m mpi4py -m pytest --with-mpi tests/mpi`` (R = 1, 2, 3 in
``make test``; R = 4 from tests/integration). Each rank also trains the single-process reference
itself, with plain torch and no communication, on the R*B samples of every global batch.

Tolerance, in float64: the two runs differ only in the order of additions. The reference takes
the mean over R*B per-sample losses at once; the ranks take R means over B and average them,
and the all-reduce may associate the R terms in any order. Each reordering changes a gradient by
a few ulps (float64 eps = 2.2e-16), and K = 6 steps of SGD/Adam at these small learning rates
carry that forward without blowing it up: measured, they agree to 1 ulp (2.2e-16). We allow
1e-12: four orders of margin above that, and nine below what a real mistake (a missing
division by R, a wrong or duplicated sample, one unsynchronised tensor) produces, which is a
difference of order lr * |g| ~ 1e-3 after the first step.

The model here has no dropout: with dropout, R ranks draw other masks than one process does, so
the runs are equal in distribution but not sample for sample. The resume test covers dropout.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

from mpi_sgd import data, gradsync
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import build_model
from mpi_sgd.trainer import Trainer
from tests.helpers import STEPS, B, assert_same_on_every_rank, flat_params, regression_set, train_config

pytestmark = pytest.mark.mpi

RTOL = ATOL = 1e-12


@pytest.fixture(scope="module")
def comm(initialised):
    return initialised


def distributed(comm, cfg: TrainConfig, ds: data.Dataset) -> Trainer:
    """What examples/sync_sgd.py trains: the library's replicas, strategy and loop."""
    return Trainer.from_config(cfg, ds, comm)


def reference(world_size: int, cfg: TrainConfig, ds: data.Dataset) -> torch.Tensor:
    """One process, batch R*B, the same samples, plain torch: no communicator, no strategy."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, tuple(ds.x.shape[1:]), ds.num_outputs).double()
    if cfg.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    step, epoch = 0, 0
    while step < cfg.max_steps:
        for idx in data.global_batches(len(ds), world_size, cfg.batch_size, epoch, cfg.seed):
            idx = idx.reshape(-1)  # all R*B samples of this global batch
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(ds.x[idx]), ds.y[idx]).backward()
            opt.step()
            step += 1
            if step == cfg.max_steps:
                break
        epoch += 1
    return flat_params(model)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("strategy", gradsync.STRATEGIES)
def test_equals_one_process_at_batch_RB(comm, strategy, optimizer):
    cfg = train_config(strategy=strategy, optimizer=optimizer, lr=0.01 if optimizer == "adam" else 0.05)
    ds = regression_set(comm.size)
    trainer = distributed(comm, cfg, ds)
    trainer.train()
    got = flat_params(trainer.model)
    want = reference(comm.size, cfg, ds)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    assert_same_on_every_rank(comm, got)


def test_linear_scaling_equals_one_process_at_the_scaled_rate(comm):
    # --lr-scaling linear from --base-batch B: R ranks step at R*lr, which is one process at batch
    # R*B and rate R*lr (the same tolerance: only the order of additions differs).
    cfg = train_config(lr=0.02, lr_scaling="linear", base_batch=B)
    ds = regression_set(comm.size)
    trainer = distributed(comm, cfg, ds)
    trainer.train()
    want = reference(comm.size, train_config(lr=0.02 * comm.size), ds)
    torch.testing.assert_close(flat_params(trainer.model), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "rules",
    [
        dict(lr_scaling="sqrt", warmup="3", schedule="cosine"),
        dict(adascale=True, warmup="2", schedule="step", grad_accum=2),
    ],
    ids=["sqrt-warmup-cosine", "adascale"],
)
def test_resume_with_a_schedule_is_bit_exact(comm, rules):
    # The schedule's state (steps, scale-invariant progress, AdaScale's running estimates) is in the
    # checkpoint: stopping at step 4 and resuming applies the rates of the run that never stopped.
    ds = regression_set(comm.size)  # 3 steps per epoch: the run of 8 crosses two epoch boundaries
    folder = comm.bcast_obj(tempfile.mkdtemp(prefix="mpi-sgd-schedule-") if comm.is_root else None)
    path = os.path.join(folder, "ckpt")
    whole = distributed(comm, train_config(max_steps=8, epochs=3, **rules), ds)
    whole.train()
    first = distributed(comm, train_config(max_steps=4, epochs=3, checkpoint=path, **rules), ds)
    first.train()
    second = distributed(comm, train_config(max_steps=8, epochs=3, **rules), ds)
    second.load_checkpoint(path)
    second.train()
    assert torch.equal(flat_params(second.model), flat_params(whole.model))
    comm.barrier()
    if comm.is_root:
        shutil.rmtree(folder)


@pytest.mark.parametrize("strategy", gradsync.STRATEGIES)
def test_gradient_accumulation_is_one_step_of_the_whole_batch(comm, strategy):
    cfg = train_config(strategy=strategy, grad_accum=4)
    ds = regression_set(comm.size)
    trainer = distributed(comm, cfg, ds)
    trainer.train()
    torch.testing.assert_close(flat_params(trainer.model), reference(comm.size, cfg, ds), rtol=RTOL, atol=ATOL)


def test_strategies_agree_with_each_other(comm):
    ds = regression_set(comm.size)
    results = []
    for strategy in gradsync.STRATEGIES:
        trainer = distributed(comm, train_config(strategy=strategy), ds)
        trainer.train()
        results.append(flat_params(trainer.model))
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], rtol=RTOL, atol=ATOL)


def test_resume_is_bit_exact(comm):
    # Dropout (per-rank RNG streams), Adam state and a stop in the middle of an epoch: everything
    # a resume has to restore.
    ds = data.blobs(num_samples=3 * comm.size * B + 3, input_size=16, num_classes=4, seed=2).to(torch.float64)
    # One directory, made by the root: pytest's tmp_path is per process and its clean-up races
    # between ranks sharing /tmp.
    folder = comm.bcast_obj(tempfile.mkdtemp(prefix="mpi-sgd-resume-") if comm.is_root else None)
    path = os.path.join(folder, "ckpt.pt")
    cfg = train_config(model="simplenet", optimizer="adam", lr=0.01, max_steps=8)
    whole = distributed(comm, cfg, ds)
    whole.train()

    first = distributed(
        comm, train_config(model="simplenet", optimizer="adam", lr=0.01, max_steps=4, checkpoint=path), ds
    )
    first.train()
    second = distributed(comm, cfg, ds)
    second.load_checkpoint(path)
    assert (second.step, second.epoch, second.step_in_epoch) == (4, 1, 1)
    second.train()
    assert torch.equal(flat_params(second.model), flat_params(whole.model))
    assert_same_on_every_rank(comm, flat_params(whole.model))
    comm.barrier()
    if comm.is_root:
        shutil.rmtree(folder)


def test_metrics_split_step_time(comm):
    trainer = distributed(comm, train_config(), regression_set(comm.size))
    metrics = trainer.train()
    assert len(trainer.t_comp) == len(trainer.t_sync) == STEPS
    assert all(t > 0 for t in trainer.t_comp) and all(t >= 0 for t in trainer.t_sync)
    if comm.is_root:
        assert len(metrics["t_comp"]) == comm.size and len(metrics["t_comp"][0]) == STEPS
        assert metrics["effective_batch"] == comm.size * B


def test_resume_at_another_global_batch_goes_on_mid_epoch(comm):
    """A checkpoint of step 2 of a 4-step epoch at R ranks x B resumes at R' = R - 1 ranks (at R = 1:
    the same rank at B + 1), and trains the rest of that epoch from the first sample not yet trained:
    one process replaying the same global batches (steps 1-2 at R*B, then the epoch's remaining
    samples in batches of R'*B', then the next epoch) ends with the same parameters (1e-12, as above)."""
    from mpi4py import MPI

    from mpi_sgd.comm.backends.mpi import MPIComm

    R, n = comm.size, 4 * comm.size * B + 5
    ds = data.toy_regression(num_samples=n, input_size=12, seed=1).to(torch.float64)
    folder = comm.bcast_obj(tempfile.mkdtemp(prefix="mpi-sgd-resize-") if comm.is_root else None)
    path = os.path.join(folder, "ckpt")
    distributed(comm, train_config(max_steps=2, epochs=3, checkpoint=path), ds).train()
    size, batch = (R - 1, B) if R > 1 else (1, B + 1)
    sub = comm.comm.Split(0 if comm.rank < size else MPI.UNDEFINED, comm.rank)
    if sub != MPI.COMM_NULL:
        small = MPIComm(sub)
        cfg = train_config(max_steps=9, epochs=3, batch_size=batch)
        second = distributed(small, cfg, ds)
        second.load_checkpoint(path)
        assert (second.epoch, second.step_in_epoch, second.epoch_offset) == (0, 0, 2 * R * B)
        second.train()
        # the reference: plain torch, one process, every global batch of both runs in turn
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, tuple(ds.x.shape[1:]), ds.num_outputs).double()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        first = data.global_batches(n, R, B, 0, cfg.seed)[:2]
        rest = data.global_batches(n, size, batch, 0, cfg.seed, offset=2 * R * B)
        after = [data.global_batches(n, size, batch, e, cfg.seed) for e in (1, 2)]
        batches = [*first, *rest, *after[0], *after[1]][: cfg.max_steps]
        assert len(batches) == cfg.max_steps  # the test reaches into the next epoch
        for idx in batches:
            idx = idx.reshape(-1)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(ds.x[idx]), ds.y[idx]).backward()
            opt.step()
        torch.testing.assert_close(flat_params(second.model), flat_params(model), rtol=RTOL, atol=ATOL)
        assert second.epoch == 1 + (len(first) + len(rest) + len(after[0]) <= cfg.max_steps)  # epoch 1 done?
        sub.Free()
    comm.barrier()
    if comm.is_root:
        shutil.rmtree(folder)
