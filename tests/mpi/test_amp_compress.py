"""Mixed precision (--amp) and 16-bit gradient all-reduce (--compress) in the trainer, on the CPU.

Each is run against the same training in float32 (same model, data, seed, R), and every rank must
end with bit-identical parameters (the averaged gradients, and so the fp16 scaler's decisions, are
the same everywhere).

Tolerances, after 6 SGD steps that move the parameters by about 0.1 (asserted, so that the
comparison means something): ``--amp bf16/fp16`` rounds matrix-product inputs to 8 (bf16) or 11
(fp16) significant bits, a relative error of up to 2^-8 = 0.4% per gradient term; measured, the
parameters end within 2e-3 of float32's at R = 1-3. We allow 5e-3. ``--compress`` rounds only the
all-reduced gradients (the bound in :mod:`mpi_sgd.comm.wrappers.compress`): measured within 2e-4 (bf16) and
2e-5 (fp16); we allow 1e-3 and 1e-4. A real mistake (a gradient not averaged, a skipped or
doubled step, a rank's gradients left out) moves parameters by a whole step, ~1e-2 to 1e-1.
"""

from __future__ import annotations

import re

import pytest
import torch

from mpi_sgd import data, gradsync
from mpi_sgd.amp import MixedPrecision
from mpi_sgd.models import build_model
from mpi_sgd.replicas import replicate
from mpi_sgd.trainer import Trainer, TrainingDiverged, make_optimizer
from tests.helpers import B, assert_same_on_every_rank, flat_params, train_config

pytestmark = pytest.mark.mpi
TOL = {"amp": 5e-3, "bf16": 1e-3, "fp16": 1e-4}


@pytest.fixture(scope="module")
def comm(initialised):
    return initialised


def train(comm, **kw) -> torch.Tensor:
    cfg = train_config(dataset="blobs", dtype="float32", **kw)  # --amp trains float32 parameters
    ds = data.blobs(num_samples=3 * comm.size * B + 5, input_size=12, num_classes=4, seed=1)
    model = replicate(lambda: build_model(cfg.model, (12,), 4), comm, cfg.seed)
    sync = gradsync.make("bucketed", model, comm, cfg.bucket_mb, compress=cfg.compress)
    Trainer(model, make_optimizer(cfg, model), sync, ds, comm, cfg).train()
    return flat_params(model)


@pytest.fixture(scope="module")
def float32_run(comm):
    got = train(comm)
    torch.manual_seed(3)
    start = flat_params(build_model("ffnet", (12,), 4))
    assert (got - start).abs().max() > 0.05, "training hardly moved: the comparisons below would prove nothing"
    return got


@pytest.mark.parametrize("mode", ("bf16", "fp16"))
def test_amp_tracks_float32(comm, float32_run, mode):
    got = train(comm, amp=mode)
    assert_same_on_every_rank(comm, got)
    torch.testing.assert_close(got, float32_run, rtol=0, atol=TOL["amp"])


@pytest.mark.parametrize("wire", ("bf16", "fp16"))
def test_compressed_gradients_track_float32(comm, float32_run, wire):
    got = train(comm, compress=wire)
    assert_same_on_every_rank(comm, got)
    torch.testing.assert_close(got, float32_run, rtol=0, atol=TOL[wire])


def test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank(comm):
    """Rank 0's loss overflows; after averaging every rank sees the inf, skips the step and
    halves the loss scale, so the replicas stay identical."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    gradsync.broadcast_parameters(model, comm)
    before = flat_params(model).clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = MixedPrecision("fp16", "cpu")
    scale = amp.scaler.get_scale()
    sync = gradsync.make("flat", model, comm)
    sync.zero_grad()
    with amp.autocast():
        loss = model(torch.ones(3, 4)).sum() * (float("inf") if comm.rank == 0 else 1.0)
    amp.backward(loss * sync.loss_scale)
    sync.wait()
    assert amp.step(opt) is False
    assert torch.equal(flat_params(model), before)  # skipped, everywhere
    assert amp.scaler.get_scale() == scale / 2
    assert_same_on_every_rank(comm, torch.tensor([amp.scaler.get_scale()]))
    assert amp.overflows == amp.overflows_in_a_row == 1


def test_fp16_with_a_loss_no_factor_can_fix_stops_every_rank_at_once(comm):
    """A rate so large that the first step throws the weights past float16's range: every later
    forward pass overflows, whatever the scaler's factor. Every rank stops at that step, naming it,
    instead of skipping every step for ever and reporting NaN losses with exit status 0."""
    with pytest.raises(TrainingDiverged) as e:
        train(comm, amp="fp16", lr=1e6, epochs=20)
    assert re.fullmatch(r"training diverged: loss (nan|inf) in step 2 \(epoch 0\) on rank.*", str(e.value))
