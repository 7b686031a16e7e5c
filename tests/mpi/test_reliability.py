"""What the ranks must agree on, checked at any world size (make test: 1 and 3; mpirun -n 2).

A bad value is put on ONE rank (the last), and every rank must reach the same verdict at the same
point: a NaN in one rank's batch stops (or skips) the step everywhere; another flag, other data or
another bucket layout on one rank stops every rank before training; one rank's parameters drifting
is caught by the checksum all-reduce; a corrupt checkpoint is refused on every rank alike, and a
good one reaches every rank as tensors without any pickled message.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

from mpi_sgd import agree, checkpoint, data, gradsync
from mpi_sgd.checkpoint import CheckpointError
from mpi_sgd.comm.wrappers.faults import Fault, FaultComm
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import build_model
from mpi_sgd.trainer import Trainer, TrainingDiverged

from .conftest import COMMS, _make

pytestmark = pytest.mark.mpi
B = 8


@pytest.fixture
def comm(world):
    return world  # MPI's world, with no abort hook: a failing test must not end the job here


def config(**kw) -> TrainConfig:
    base = dict(model="ffnet", dataset="toy", batch_size=B, dtype="float64", epochs=5, progress=False, seed=3)
    return TrainConfig(**{**base, **kw})


def toy(comm) -> data.Dataset:
    return data.toy_regression(num_samples=4 * comm.size * B, input_size=6, seed=1).to(torch.float64)


def poisoned(comm, step: int, rank: int) -> data.Dataset:
    """``toy`` with a NaN in one sample that ``rank`` trains on in 1-based ``step`` (epoch 0).
    Every rank holds the same data (as it must), so only ``rank``'s own batch meets the NaN."""
    ds = toy(comm)
    idx = data.rank_batches(len(ds), rank, comm.size, B, 0, 3)[step - 1][1]
    x = ds.x.clone()
    x[idx, 2] = float("nan")
    return data.Dataset(x, ds.y, ds.name)


def params(t: Trainer) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in t.model.parameters()])


@pytest.mark.parametrize("strategy", ["naive", "bucketed"])
def test_nan_on_one_rank_stops_every_rank_at_that_step(comm, strategy):
    last = comm.size - 1
    t = Trainer.from_config(config(strategy=strategy, bucket_mb=0.001), poisoned(comm, 3, last), comm)
    with pytest.raises(TrainingDiverged) as e:
        t.train()
    assert f"loss nan in step 3 (epoch 0) on rank {last};" in str(e.value)
    assert t.step == 2  # every rank stopped before applying step 3
    clean = Trainer.from_config(config(strategy=strategy, bucket_mb=0.001, max_steps=2), toy(comm), comm)
    clean.train()
    assert torch.equal(params(t), params(clean))


@pytest.mark.parametrize("strategy", ["naive", "flat", "bucketed"])
def test_finite_gradients_whose_sum_would_overflow_stop_every_rank(comm, strategy):
    # float32: each rank's -2e38 is finite, their sum over two or more ranks is -inf, in an element
    # other than the flag's. Each rank's sum of squares before sending refuses it (at one rank too:
    # the bound does not depend on R).
    model = build_model("ffnet", (6,), 1)
    sync = gradsync.make(strategy, model, comm, bucket_mb=0.001)
    first = list(model.parameters())[0]
    first.register_hook(lambda g: g.reshape(-1).index_fill(0, torch.tensor([1]), -2e38).view_as(g))
    sync.zero_grad()
    sync.begin_step()
    with sync.accumulate(last=True):
        model(torch.randn(4, 6)).sum().backward()
    sync.wait()
    assert comm.allgather_obj(sync.finite()) == [False] * comm.size


def stopped_by_a_nan_in_transit(comm, cfg: TrainConfig) -> tuple[Trainer, str]:
    """Train ``cfg`` with a NaN put into the last rank's all-reduce at step 3; the trainer and its
    message, checked to name that rank as the fault wrapper says it acted."""
    last = comm.size - 1
    t = Trainer.from_config(cfg, toy(comm), FaultComm(comm, Fault(last, 3, "nan")))
    with pytest.raises(TrainingDiverged) as e:
        t.train()
    text = str(e.value)
    assert f"in step 3 (epoch 0): corrupted in transit by rank {last} (MPI_SGD_FAULT={last}:3:nan" in text
    return t, text


def test_nan_sent_by_one_rank_is_named_on_every_rank(comm):
    # The NaN enters inside the last rank's all-reduce, after its own gradients were checked: every
    # rank sees only a bad sum, yet every rank stops at that step with one message naming the rank
    # (the fault wrapper says what it did; a bad link would be reported as corruption, no rank named).
    t, text = stopped_by_a_nan_in_transit(comm, config(strategy="bucketed", bucket_mb=0.001))
    assert "every rank's own gradient was finite before sending" in text
    assert t.step == 2 and comm.allgather_obj(text) == [text] * comm.size


def test_skip_leaves_the_step_out_on_every_rank(comm):
    last = comm.size - 1
    t = Trainer.from_config(config(on_nonfinite="skip", max_steps=3), poisoned(comm, 3, last), comm)
    t.train()  # ends with the replica check: bit-identical on every rank
    clean = Trainer.from_config(config(max_steps=2), toy(comm), comm)
    clean.train()
    assert t.skipped == 1 and torch.equal(params(t), params(clean))


def refused(comm, cfg, ds) -> str:
    with pytest.raises(agree.ConfigMismatch) as e:
        Trainer.from_config(cfg, ds, comm)
    text = str(e.value)
    everyone = comm.allgather_obj(text)
    assert everyone == [text] * comm.size  # the same verdict on every rank
    return text


def test_one_rank_with_another_flag_data_or_layout_stops_every_rank(comm):
    odd = comm.rank == comm.size - 1 and comm.size > 1
    if comm.size == 1:  # nothing to disagree with: the check passes and costs one all-gather
        Trainer.from_config(config(), toy(comm), comm)
        return
    last = comm.size - 1
    others = ", ".join(map(str, range(last)))
    ranks = f"rank{'s' if last > 1 else ''} {others}"
    text = refused(comm, config(lr=0.1 if odd else 0.05), toy(comm))
    assert f"--lr: 0.05 on {ranks}; 0.1 on rank {last}" in text and "none trains" in text
    ds = toy(comm)
    if odd:
        ds = data.Dataset(ds.x + 1e-9, ds.y, ds.name)  # a different file behind the same name
    assert "data: " in refused(comm, config(), ds)
    assert "--bucket-mb: 1.0 on" in refused(comm, config(bucket_mb=0.0005 if odd else 1.0), toy(comm))
    # The layout on its own (other model code, another torch): compared once the strategy is built.
    model = build_model("ffnet", (6,), 1)
    # Ordinary buckets: shared ones would be refused earlier, by alloc_shared's own size check.
    sync = gradsync.make("bucketed", model, comm, bucket_mb=0.0005 if odd else 1.0, shared=False)
    with pytest.raises(agree.ConfigMismatch, match=f"gradient buckets: .* on {ranks}; .* on rank {last}"):
        agree.check_layout(comm, sync)


def test_one_rank_drifting_is_caught_by_the_checksum(comm):
    t = Trainer.from_config(config(max_steps=2), toy(comm), comm)
    t.train()
    agree.check_replicas(comm, t.model, t.step)  # identical: passes
    if comm.size == 1:
        return
    if comm.rank == comm.size - 1:
        with torch.no_grad():
            p = next(t.model.parameters())
            p.view(-1)[0] = torch.nextafter(p.view(-1)[0], torch.tensor(1.0, dtype=p.dtype))  # one ulp
    with pytest.raises(agree.ReplicasDiverged, match=f"the parameters of rank {comm.size - 1} differ"):
        agree.check_replicas(comm, t.model, t.step)


def test_checkpoints_reach_every_rank_as_tensors_and_corruption_everywhere(comm, monkeypatch):
    folder = comm.bcast_obj(tempfile.mkdtemp(prefix="mpi-sgd-ckpt-") if comm.is_root else None)
    d = os.path.join(folder, "ck")
    Trainer.from_config(config(max_steps=3, checkpoint=d), toy(comm), comm).train()

    pickled = comm.bcast_obj

    def no_pickles(obj, root=0):
        # the read's verdict may travel so (None, or a one-line failure: mpi_sgd.checkpoint.deadline); no state may
        assert obj is None or isinstance(obj, str), "a checkpoint must not travel as a pickled object"
        return pickled(obj, root)

    monkeypatch.setattr(comm, "bcast_obj", no_pickles)
    t = Trainer.from_config(config(max_steps=6), toy(comm), comm)
    assert t.load_checkpoint(d).endswith("step-00000003") and t.step == 3
    monkeypatch.undo()
    comm.barrier()
    if comm.is_root:
        state = os.path.join(d, "step-00000003", "state.pt")
        raw = bytearray(open(state, "rb").read())
        raw[len(raw) // 2] ^= 0xFF
        open(state, "wb").write(bytes(raw))
    comm.barrier()
    with pytest.raises(CheckpointError, match="is corrupt"):
        Trainer.from_config(config(max_steps=6), toy(comm), comm).load_checkpoint(d)
    comm.barrier()
    if comm.is_root:
        shutil.rmtree(folder)


@pytest.mark.parametrize("name", COMMS)
def test_checkpoint_bytes_travel_on_every_backend(world, name):
    folder = world.bcast_obj(tempfile.mkdtemp(prefix="mpi-sgd-ckpt-") if world.is_root else None)
    d = os.path.join(folder, "ck")
    if world.is_root:
        checkpoint.save(checkpoint.serialize({"w": torch.arange(5.0), "step": 7}), {"step": 7}, d, 7)
    world.barrier()
    state, meta, path = checkpoint.load(d, _make(name))
    assert torch.equal(state["w"], torch.arange(5.0)) and meta["step"] == 7 and path.endswith("step-00000007")
    world.barrier()
    if world.is_root:
        shutil.rmtree(folder)
