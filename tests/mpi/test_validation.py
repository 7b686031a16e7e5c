"""The held-out score across R ranks equals the one-process score of the same model on the whole
held-out set, and scoring changes nothing about training.

Tolerance for the score, in float64: each rank sums its share's per-sample losses and the
all-reduce adds the R partial sums, so the result differs from one process's sum only in the
order of additions: a few ulps of the sum (float64 eps 2.2e-16) over a few hundred terms. We allow
1e-12 relative: far above that, and far below what a rank scoring a wrong or overlapping share,
or a missing division, produces (errors of order 1/R or 1/N, >= 1e-3 here).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from mpi_sgd import data, gradsync
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import build_model
from mpi_sgd.replicas import replicate
from mpi_sgd.trainer import Trainer, make_optimizer

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def comm(initialised):
    return initialised


def blobs_split(comm):
    # 101 held out: uneven shares at R = 2 and 3, so the split by split_counts is exercised.
    ds = data.blobs(num_samples=8 * comm.size * 8 + 101, input_size=16, num_classes=4, seed=2).to(torch.float64)
    train, val = data.split(ds, 101 / len(ds), seed=4)
    assert len(val) == 101
    return train, val


def run(comm, train, val, **kw) -> Trainer:
    cfg = TrainConfig(model="simplenet", dataset="blobs", batch_size=8, epochs=2, progress=False, dtype="float64", **kw)
    model = replicate(
        lambda: build_model(cfg.model, tuple(train.x.shape[1:]), train.num_outputs).double(), comm, cfg.seed
    )
    sync = gradsync.make(cfg.strategy, model, comm, cfg.bucket_mb)
    trainer = Trainer(model, make_optimizer(cfg, model), sync, train, comm, cfg, val=val)
    trainer.train()
    return trainer


def test_held_out_score_across_ranks_equals_one_process(comm):
    train, val = blobs_split(comm)
    trainer = run(comm, train, val)
    model = trainer.model.eval()
    with torch.no_grad():  # the reference: one process, the whole held-out set at once
        out = model(val.x)
        want_loss = F.cross_entropy(out, val.y).item()
        want_acc = (out.argmax(1) == val.y).double().mean().item()
    last = trainer.history[-1]
    assert last["val_loss"] == pytest.approx(want_loss, rel=1e-12, abs=0)
    assert last["val_accuracy"] == pytest.approx(want_acc, rel=1e-12, abs=0)


def test_scoring_changes_nothing_about_training(comm):
    # Dropout is on in training and off while scoring; scoring must draw no random numbers and
    # touch no parameter, or the run with a held-out set would drift from the run without.
    train, val = blobs_split(comm)
    scored = torch.cat([p.detach().reshape(-1) for p in run(comm, train, val).model.parameters()])
    plain = torch.cat([p.detach().reshape(-1) for p in run(comm, train, None).model.parameters()])
    assert torch.equal(scored, plain)


def test_every_rank_holds_out_the_same_samples(comm):
    _, val = data.prepare("toy", seed=3, val_fraction=0.1)
    mine = torch.tensor([val.x.double().sum().item(), val.y.double().sum().item(), len(val)], dtype=torch.float64)
    everyone = torch.zeros(comm.size, 3, dtype=torch.float64)
    comm.allgather(mine, everyone)
    assert all(torch.equal(everyone[r], everyone[0]) for r in range(comm.size))
