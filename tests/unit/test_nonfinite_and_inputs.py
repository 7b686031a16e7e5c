"""Non-finite values stop training (or skip the step) instead of being trained on, and inputs that
would only fail later are refused at load with one line. One process here; tests/mpi runs the
same at several world sizes, with the bad value on one rank only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpi_sgd import data, gradsync
from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.comm.wrappers.faults import Fault, FaultComm
from mpi_sgd.comm.wrappers.wrapper import CommWrapper
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import build_model
from mpi_sgd.trainer import Trainer, TrainingDiverged

B = 8


def trainer(ds, **kw) -> Trainer:
    cfg = TrainConfig(
        **{
            "model": "ffnet",
            "dataset": "toy",
            "epochs": 5,
            "batch_size": B,
            "progress": False,
            "dtype": "float64",
            "seed": 3,
            **kw,
        }
    )
    return Trainer.from_config(cfg, ds, LocalComm())


def toy() -> data.Dataset:
    return data.toy_regression(num_samples=40, input_size=6, seed=1).to(torch.float64)


def poisoned(step: int) -> data.Dataset:
    """``toy()`` with a NaN in one sample of the batch of 1-based ``step`` (epoch 0)."""
    ds = toy()
    idx = data.rank_batches(len(ds), 0, 1, B, 0, 3)[step - 1][2]
    x = ds.x.clone()
    x[idx, 4] = float("nan")
    return data.Dataset(x, ds.y, ds.name)


def params(t: Trainer) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in t.model.parameters()])


def test_nan_in_a_batch_stops_at_that_step_untrained():
    t = trainer(poisoned(3))
    with pytest.raises(TrainingDiverged, match=r"loss nan in step 3 \(epoch 0\) on rank 0"):
        t.train()
    before = trainer(toy(), max_steps=2)
    before.train()
    assert t.step == 2 and torch.equal(params(t), params(before))  # the NaN step was not applied


def test_skip_leaves_the_step_out_on_every_rank(capsys):
    # Skipping step 3 leaves exactly the parameters (and momentum) of steps 1-2; step 4 then goes on.
    t = trainer(poisoned(3), max_steps=3, on_nonfinite="skip")
    t.train()
    two = trainer(toy(), max_steps=2)
    two.train()
    assert t.skipped == 1 and torch.equal(params(t), params(two))
    assert "skipped step 3 on every rank: loss nan in step 3" in capsys.readouterr().err
    assert t.metrics()["skipped_steps"] == 1


def test_skip_cannot_rescue_non_finite_parameters():
    t = trainer(toy(), lr=1e30, on_nonfinite="skip", optimizer="sgd", momentum=0.0)
    with pytest.raises(TrainingDiverged, match="skipping cannot help: 10 steps in a row"):
        t.train()


@pytest.mark.parametrize("strategy", gradsync.STRATEGIES)
def test_a_gradient_nan_anywhere_reaches_element_0_of_what_is_sent(strategy):
    model = build_model("ffnet", (6,), 1).double()
    sync = gradsync.make(strategy, model, LocalComm(), bucket_mb=0.001)
    first = list(model.parameters())[0]
    # inf at the far end of one gradient, put there before it is accumulated (and, bucketed, sent)
    handle = first.register_hook(lambda g: torch.cat([g.reshape(-1)[:-1], g.new_full((1,), float("inf"))]).view_as(g))

    def step(loss: float | None = None) -> tuple[bool, bool]:
        """One checked step; (every rank's verdict, this rank's own) after it."""
        sync.zero_grad()
        sync.begin_step()
        if loss is not None:
            sync.note_loss(torch.tensor(loss))
        with sync.accumulate():
            model(torch.randn(4, 6, dtype=torch.float64)).sum().backward()
        sync.wait()
        return sync.finite(), sync.local_finite

    assert step() == (False, False)
    handle.remove()
    assert step(float("inf")) == (False, False)  # a non-finite loss with finite gradients: still refused
    assert step(1.0) == (True, True)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the branch-free flag of a GPU"),
        ),
    ],
)
def test_the_flag_lands_in_element_0_of_every_shard_and_only_when_needed(device):
    # ZeRO reduce-scatters in shards: each shard's element 0 carries the flag (its owner reads it).
    sync = gradsync.LocalGradients(build_model("ffnet", (6,), 1))
    clean = torch.arange(12.0, device=device)
    for bad, loss in ((None, 1.0), (None, float("inf")), (7, 1.0)):
        buf = clean.clone()
        if bad is not None:
            buf[bad] = float("-inf")
        sync.begin_step()
        sync.note_loss(torch.tensor(loss, device=device))
        sync.outgoing(buf, shards=3, result=buf[4:8])
        if bad is None and loss == 1.0:
            assert torch.equal(buf, clean) and sync.finite() and sync.local_finite  # finite: bits unchanged
        else:
            assert torch.isnan(buf[[0, 4, 8]]).all() and not torch.isnan(buf[[1, 2, 3, 5, 6, 9, 10, 11]]).any()
            assert not sync.finite() and not sync.local_finite


def test_world_size_1_without_communication_checks_its_own_gradients():
    model = build_model("ffnet", (6,), 1).double()
    sync = gradsync.LocalGradients(model)
    for poison, finite in ((0.0, True), (float("nan"), False)):
        sync.zero_grad()
        sync.begin_step()
        (model(torch.randn(4, 6, dtype=torch.float64)).sum() * 1.0).backward()
        list(model.parameters())[-1].grad.view(-1)[-1] += poison
        assert sync.finite() is finite and sync.local_finite is finite


class Corrupting(CommWrapper):
    """Adds ``value`` to every element a flat all-reduce returns, and says nothing: a bad link."""

    def __init__(self, inner, value: float):
        super().__init__(inner)
        self.value = value

    def allreduce(self, buf, op="sum"):
        self.inner.allreduce(buf, op)
        return buf.add_(self.value)


OWN = "every rank's own gradient was finite"


@pytest.mark.parametrize(
    ("comm", "message"),
    [
        (
            FaultComm(LocalComm(), Fault(0, 3, "nan")),
            "in step 3 (epoch 0): corrupted in transit by rank 0 (MPI_SGD_FAULT=0:3:nan replaced",
        ),
        (Corrupting(LocalComm(), float("nan")), f"in step 1 (epoch 0): the sum holds NaN though {OWN}"),
        (Corrupting(LocalComm(), float("inf")), f"in step 1 (epoch 0): the sum overflowed to inf though {OWN}"),
    ],
    ids=["injected", "nan", "inf"],
)
def test_a_sum_gone_bad_in_transit_says_what_is_known(comm, message):
    # Every rank's own gradients are finite here; only the reduced sum is not. The message must say
    # so, and name the rank when a wrapper knows it corrupted the data (fault injection does).
    cfg = TrainConfig(
        model="ffnet", dataset="toy", epochs=1, batch_size=B, progress=False, dtype="float64", strategy="flat"
    )
    t = Trainer.from_config(cfg, toy(), comm)
    with pytest.raises(TrainingDiverged) as e:
        t.train()
    assert message in str(e.value) and "every rank's own gradient was finite before sending" in str(e.value)


def test_finite_steps_stay_bit_identical_to_plain_training():
    # The check writes element 0 only when it is poisoned: finite training is untouched.
    t = trainer(toy(), max_steps=4, strategy="bucketed", bucket_mb=0.0005)
    t.train()
    u = trainer(toy(), max_steps=4, strategy="naive")
    u.train()
    torch.testing.assert_close(params(t), params(u), rtol=1e-12, atol=1e-12)  # as tests/mpi: order of sums only


# -- inputs refused at load ---------------------------------------------------------------------
@pytest.mark.parametrize("lr", [float("inf"), float("nan"), -1.0])
def test_lr_must_be_positive_and_finite(lr):
    with pytest.raises(ValueError, match="--lr must be positive and finite"):
        TrainConfig(lr=lr)


def npz(tmp_path, **arrays) -> str:
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    return str(path)


x10 = np.zeros((10, 3), np.float32)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.array(["a"] * 10), "y": np.zeros(10, np.int64)}, "x must be numbers, but its dtype is <U1"),
        ({"x": x10, "y": np.array(["cat"] * 10)}, "y must be numbers"),
        ({"x": x10, "y": np.array([0, 1] * 4 + [1, 100000])}, "the largest, 100000, would make C = 100001"),
        ({"x": x10, "y": np.array([0, 1] * 4 + [1, 7])}, "only 3 occur; renumber the labels 0 .. 2"),
        ({"x": x10, "y": np.array([0, 1] * 4 + [1, -1])}, "must be >= 0, found -1"),
        ({"x": x10, "y": np.zeros(10, np.int64)}, "every y is class 0 (10 samples): nothing to learn"),
        ({"x": x10, "y": np.full(10, 3)}, "every y is class 3 (10 samples)"),  # not "renumber 0 .. 0"
        (
            {"x": np.where(np.arange(30).reshape(10, 3) == 17, np.nan, x10), "y": np.arange(10) % 2},
            "x holds inf or nan in 1 sample(s), the first at index 5",
        ),
        ({"x": x10, "y": np.array([0.5] * 9 + [np.inf])}, "y holds inf or nan"),
    ],
)
def test_bad_data_is_refused_at_load_with_one_line(tmp_path, arrays, message):
    with pytest.raises(ValueError) as e:
        data.load(npz(tmp_path, **arrays))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_pt_files_tensors_are_real_numbers_and_data_not_a_graph(tmp_path):
    path = str(tmp_path / "d.pt")
    y = torch.arange(10) % 2
    torch.save({"x": torch.randn(10, 3, dtype=torch.complex64), "y": y}, path)
    with pytest.raises(ValueError, match=r"x must be real numbers, but its dtype is torch.complex64$"):
        data.load(path)  # made float, complex values would lose their imaginary part
    torch.save({"x": torch.randn(0, 3), "y": y[:0]}, path)
    with pytest.raises(ValueError, match=r"holds no samples \(x is empty\)$"):
        data.load(path)
    torch.save({"x": torch.randn(10, 3, requires_grad=True), "y": y}, path)  # saved from a graph
    ds = data.load(path)
    assert not ds.x.requires_grad and ds.x.grad_fn is None  # else every step backwards into it


def test_plausible_labels_pass():
    y = torch.tensor([0, 2, 3, 2, 0])  # class 1 absent: 3 of 4 classes occur, fine
    data.check_labels(y, "f.npz")


def test_training_runs_with_the_heap_frozen_and_hands_it_back():
    # A full collection walks every object torch's import made; frozen, they are not walked while
    # training (mpi_sgd/gcpause.py). Afterwards the process is as it was.
    import gc

    t = trainer(toy(), epochs=1)
    seen = []
    t.model.register_forward_hook(lambda *_: seen.append(gc.get_freeze_count()))
    assert gc.get_freeze_count() == 0
    t.train()
    assert seen and min(seen) > 1000, seen[:3]
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_by_the_caller_stays_frozen():
    import gc

    gc.freeze()
    try:
        trainer(toy(), epochs=1).train()
        assert gc.get_freeze_count() > 0  # not handed back: the caller's objects are among them
    finally:
        gc.unfreeze()


def test_finite_gradients_whose_sum_over_ranks_would_overflow_are_refused_before_sending():
    # Two ranks each sending -2e38 in element 1 sum to -inf there, an element the verdict never
    # reads; the sum of squares each rank takes before sending refuses them (the two-rank job:
    # tests/mpi/test_reliability.py).
    sync = gradsync.LocalGradients(build_model("ffnet", (6,), 1))
    buf = torch.zeros(8)
    buf[1] = -2e38
    sync.begin_step()
    sync.outgoing(buf)
    assert torch.isnan(buf[0]) and buf[1] == -2e38  # the flag, and the value left as it was
    assert not sync.finite() and not sync.local_finite
    buf = torch.full((8,), 1e18)  # large, but no sum over any number of ranks overflows
    sync.begin_step()
    sync.outgoing(buf)
    assert sync.finite() and torch.equal(buf, torch.full((8,), 1e18))


def test_float64_values_beyond_float32_are_refused_not_made_inf(tmp_path):
    x = np.zeros((10, 3))
    x[3, 1] = 1e39  # finite in float64, inf in the float32 the model trains in
    with pytest.raises(ValueError) as e:
        data.load(npz(tmp_path, x=x, y=np.arange(10) % 2))
    assert str(e.value).endswith("x holds values beyond float32's range (±3.4e38) in 1 sample(s), the first at index 3")


def test_a_class_found_only_among_the_held_out_samples_still_has_an_output():
    y = torch.tensor([0, 1] * 9 + [2])  # class 2 once: the split below holds it out
    ds = data.Dataset(torch.randn(19, 3), y, "mine")
    for seed in range(100):
        train, val = data.split(ds, 0.1, seed)
        if 2 in val.y:
            break
    assert 2 not in train.y and 2 in val.y
    assert train.num_outputs == val.num_outputs == 3 == train.to(torch.float64).num_outputs
