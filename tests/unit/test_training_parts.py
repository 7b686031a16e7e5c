"""The trainer's parts without MPI: partitioner, config checks, data files, checkpoints, buckets, hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpi_sgd import data, gradsync
from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.comm.base import Request
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import MLP, build_model


# -- partitioner ---------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ranks_get_disjoint_equal_shards_of_the_same_global_batches(world_size):
    n, b = 103, 4
    idx = data.global_batches(n, world_size, b, epoch=0, seed=5)
    assert idx.shape == (n // (world_size * b), world_size, b)
    flat = idx.reshape(-1)
    assert len(set(flat.tolist())) == flat.numel()  # no sample twice in an epoch
    # R ranks of batch B see exactly the samples of one process at batch R*B, step by step
    single = data.global_batches(n, 1, world_size * b, epoch=0, seed=5)
    assert torch.equal(idx.reshape(idx.shape[0], -1), single.reshape(single.shape[0], -1))
    for r in range(world_size):
        assert torch.equal(data.rank_batches(n, r, world_size, b, 0, 5), idx[:, r])


def test_reshuffled_every_epoch_and_remainder_varies():
    a = data.global_batches(50, 2, 4, epoch=0, seed=1).reshape(-1)
    b = data.global_batches(50, 2, 4, epoch=1, seed=1).reshape(-1)
    assert not torch.equal(a, b)
    left_out = [set(range(50)) - set(data.global_batches(50, 2, 4, e, 1).reshape(-1).tolist()) for e in range(5)]
    assert all(len(s) == 50 - 48 for s in left_out) and len(set(map(frozenset, left_out))) > 1


def test_dataset_smaller_than_RB_is_refused():
    with pytest.raises(ValueError, match=r"R\*B = 4\*8 = 32"):
        data.check_size(31, 4, 8)
    assert data.check_size(32, 4, 8) == 1


# -- config --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, message",
    [
        ({"batch_size": 0}, "--batch-size must be at least 1"),
        ({"lr": -0.1}, "--lr must be positive"),
        ({"model": "resnet"}, "unknown model 'resnet'"),
        ({"strategy": "ring"}, "unknown strategy 'ring'"),
        ({"optimizer": "lbfgs"}, "unknown optimizer"),
        ({"dataset": "mnist"}, "unknown dataset 'mnist'"),
        ({"grad_accum": 3, "batch_size": 8}, "--grad-accum must divide"),
        ({"bucket_mb": 0}, "--bucket-mb must be positive"),
        ({"amp": "fp8"}, "unknown --amp 'fp8'"),
        ({"amp": "bf16", "dtype": "float64"}, "--amp bf16 needs --dtype float32"),
        ({"compress": "int8"}, "unknown --compress 'int8'"),
        ({"zero": 4}, "--zero must be 0, 1, 2 or 3"),
        ({"zero": 2, "compress": "bf16"}, "--compress applies to the all-reduce strategies, not --zero"),
        ({"zero": 1, "amp": "fp16"}, "--amp fp16 cannot be combined with --zero"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(kw, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        TrainConfig(**kw)


def test_every_flag_has_help():
    from mpi_sgd.args import ArgumentParser

    parser = ArgumentParser()
    cfg = parser.parse_flags(TrainConfig, ["--batch-size", "16", "--no-progress", "--strategy", "flat"])
    for action in parser._actions[1:]:  # a default of None is explained in the help itself
        assert action.help and ("default" in action.help or action.default is None)
    assert (cfg.batch_size, cfg.progress, cfg.strategy) == (16, False, "flat")


# -- data files ----------------------------------------------------------------------------------
def test_user_files(tmp_path):
    good = tmp_path / "good.npz"
    np.savez(good, x=np.zeros((10, 3), np.float32), y=np.arange(10) % 2)
    ds = data.load(str(good))
    assert ds.classification and len(ds) == 10 and ds.num_outputs == 2
    pt = tmp_path / "reg.pt"
    torch.save({"x": torch.randn(6, 2), "y": torch.randn(6)}, pt)
    ds = data.load(str(pt))
    assert not ds.classification and ds.y.shape == (6, 1)
    np.savez(tmp_path / "nox.npz", y=np.zeros(3))
    with pytest.raises(ValueError, match="no array named x"):
        data.load(str(tmp_path / "nox.npz"))
    with pytest.raises(ValueError, match="does not exist"):
        data.load(str(tmp_path / "missing.npz"))


def test_synthetic_data_is_a_function_of_the_seed():
    assert torch.equal(data.toy_regression(64, 5, seed=3).x, data.toy_regression(64, 5, seed=3).x)
    assert not torch.equal(data.blobs(64, 5, seed=3).x, data.blobs(64, 5, seed=4).x)


@pytest.mark.parametrize("name", ["ffnet", "mlp", "simplenet", "lenet"])
def test_models_take_image_shaped_input(name):
    model = build_model(name, (1, 8, 8), 10)
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


# -- buckets and hooks ---------------------------------------------------------------------------
def test_buckets_follow_reverse_parameter_order_and_hold_the_gradients():
    model = MLP((32, 64, 64, 4))
    sizes = [p.numel() * 4 for p in model.parameters()]
    sync = gradsync.BucketedAllReduce(model, LocalComm(), bucket_mb=16 * 1024 / 2**20)  # 16 KiB buckets
    order = [p for b in sync.buckets for p in b.params]
    assert order == list(model.parameters())[::-1]
    sync.zero_grad()
    with sync.accumulate():
        model(torch.randn(3, 32)).sum().backward()
    sync.wait()
    for b in sync.buckets:
        if b.solo:  # a tensor alone in its bucket is reduced in autograd's own gradient
            assert len(b.params) == 1 and b.buffer is b.params[0].grad
        else:
            assert b.buffer.numel() * 4 <= 16 * 1024
            for p in b.params:  # each gradient is a view into its bucket: no copies
                assert p.grad.untyped_storage().data_ptr() == b.buffer.untyped_storage().data_ptr()
    assert any(b.solo for b in sync.buckets) and not all(b.solo for b in sync.buckets)
    assert sum(sizes) == sum(b.buffer.numel() * 4 for b in sync.buckets)


class RecordingComm(LocalComm):
    """World size 2 as far as the strategy can tell; records when each all-reduce starts."""

    def __init__(self):
        super().__init__()
        self.size, self.started = 2, []

    def iallreduce(self, buf, op="sum"):
        self.started.append((buf.data_ptr(), self.phase))
        return Request.completed()


def test_only_the_last_micro_batch_communicates_and_buckets_start_in_order():
    torch.manual_seed(0)
    model = MLP((16, 32, 32, 4))
    comm = RecordingComm()
    sync = gradsync.BucketedAllReduce(model, comm, bucket_mb=2048 / 2**20)
    sync.zero_grad()
    x = torch.randn(12, 16)
    for i, xm in enumerate(x.chunk(3)):
        comm.phase = f"backward {i}"
        with sync.accumulate(last=i == 2):
            (model(xm).square().mean() * sync.loss_scale).backward()
    comm.phase = "wait"
    sync.wait()
    assert [phase for _, phase in comm.started] == ["backward 2"] * len(sync.buckets)  # overlapped, none early
    assert [ptr for ptr, _ in comm.started] == [b.buffer.data_ptr() for b in sync.buckets]


@pytest.mark.parametrize("strategy", gradsync.STRATEGIES)
def test_world_of_one_is_plain_sgd(strategy):
    torch.manual_seed(0)
    ref, model = MLP((8, 16, 2)).double(), MLP((8, 16, 2)).double()
    model.load_state_dict(ref.state_dict())
    sync = gradsync.make(strategy, model, LocalComm(), bucket_mb=0.001)
    x = torch.randn(5, 8, dtype=torch.float64)
    ref(x).sum().backward()
    sync.zero_grad()
    with sync.accumulate():
        (model(x).sum() * sync.loss_scale).backward()
    sync.wait()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("strategy", gradsync.STRATEGIES)
def test_a_parameter_without_gradient_is_reduced_as_zeros(strategy):
    # Every rank must make the same collective calls even when part of the model sat idle.
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 2), "idle": torch.nn.Linear(4, 2)})
    sync = gradsync.make(strategy, model, RecordingComm() if strategy == "bucketed" else LocalComm(), 1e-5)
    if strategy == "bucketed":
        sync.comm.phase = "backward"
    sync.zero_grad()
    with sync.accumulate():
        model["used"](torch.randn(3, 4)).sum().backward()
    sync.wait()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model["idle"].parameters())
    if strategy == "bucketed":
        assert len(sync.comm.started) == len(sync.buckets)  # the idle buckets were reduced too
