"""ZeRO's parts without MPI: the shard layout at any (rank, R), the byte counter, and a whole
step at world size 1 (the size-1 backend) against plain torch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mpi_sgd import zero
from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.comm.wrappers.counting import CountingComm
from mpi_sgd.zero.units import build_units


def tiny() -> nn.Module:
    torch.manual_seed(0)  # units of 65, 6 and 2 elements
    return nn.Sequential(nn.Linear(12, 5), nn.Tanh(), nn.Linear(5, 1), nn.Linear(1, 1)).double()


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_every_rank_owns_one_equal_shard_and_together_they_are_the_model(size):
    flat = torch.cat([p.detach().reshape(-1) for p in tiny().parameters()])
    shards = []
    for rank in range(size):
        units = build_units(tiny(), rank, size, separate_shard=True)
        assert [u.numel for u in units] == [65, 6, 2]
        for u in units:
            assert u.shard_numel == -(-u.numel // size) and u.padded == size * u.shard_numel
            assert u.padded - u.numel < size  # at most R-1 elements of padding
        shards.append(units)
    for i, numel in enumerate([65, 6, 2]):
        whole = torch.cat([shards[r][i].shard for r in range(size)])
        start = [0, 65, 71][i]
        assert torch.equal(whole[:numel], flat[start : start + numel])
        assert not whole[numel:].any()  # the padding is zero


def test_parameters_are_views_of_the_flat_buffer():
    model = tiny()
    (u, *_) = build_units(model, 0, 3, separate_shard=False)
    u.full[0] = 42.0
    assert model[0].weight[0, 0].item() == 42.0
    u.free_params()
    assert not u.gathered and model[0].weight.shape == (5, 12)  # shape kept, storage released
    u.alloc_params()
    assert u.gathered


def test_tied_weights_are_refused():
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    with pytest.raises(ValueError, match="share a parameter"):
        build_units(nn.Sequential(a, b), 0, 2, separate_shard=False)


def test_counting_communicator_counts_payload():
    counting = CountingComm(LocalComm())
    x = torch.zeros(10, dtype=torch.float64)
    counting.allreduce(x)
    counting.reduce_scatter(x, torch.zeros(10, dtype=torch.float64))
    counting.iallgather(x, torch.zeros(1, 10, dtype=torch.float64)).wait()
    assert dict(counting.bytes) == {"allreduce": 80, "reduce_scatter": 80, "allgather": 80}
    assert counting.volume() == 2 * 80 + 80 + 80 and counting.ring_bytes_sent() == 0  # R = 1 sends nothing


@pytest.mark.parametrize("stage", zero.STAGES)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_one_rank_is_plain_torch_bit_for_bit(stage, optimizer):
    """At R = 1 there is nothing to sum: every stage must give exactly plain torch's parameters."""
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "adam": lambda p: torch.optim.Adam(p, lr=0.01)}
    ref, model = tiny(), tiny()
    ref_opt = make[optimizer](ref.parameters())
    sync, opt = zero.make(stage, model, LocalComm(), make[optimizer])
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x, y = torch.randn(8, 12, generator=g, dtype=torch.float64), torch.randn(8, 1, generator=g, dtype=torch.float64)
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        sync.zero_grad()
        for i, (xm, ym) in enumerate(zip(x.chunk(2), y.chunk(2), strict=True)):  # two micro-batches
            with sync.accumulate(last=i == 1):
                (nn.functional.mse_loss(model(xm), ym) * sync.loss_scale / 2).backward()
        sync.wait()
        opt.step()
    with sync.full_parameters():
        got = [p.detach().clone() for p in model.parameters()]
    # Two half-batch means summed equal the whole batch's mean to rounding, not bit for bit.
    for a, b in zip(got, ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stage", zero.STAGES)
def test_full_state_round_trips_in_plain_torch_format(stage):
    model, ref = tiny(), tiny()
    sync, opt = zero.make(stage, model, LocalComm(), lambda p: torch.optim.Adam(p, lr=0.01))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    x, y = torch.randn(8, 12, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
    for m, o, s in ((model, opt, sync), (ref, ref_opt, None)):
        (s or o).zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        if s:
            s.wait()
        o.step()
    model_state, opt_state = opt.full_state_dict()
    assert model_state.keys() == ref.state_dict().keys()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(model_state[k], v, rtol=0, atol=1e-15)
    want = ref_opt.state_dict()
    assert opt_state["param_groups"][0]["params"] == want["param_groups"][0]["params"]
    assert opt_state["state"].keys() == want["state"].keys()
    for i, st in want["state"].items():
        for key, value in st.items():
            torch.testing.assert_close(opt_state["state"][i][key], value, rtol=0, atol=1e-15)
    # back in, into a fresh engine: the same shards, bit for bit
    model2 = tiny()
    sync2, opt2 = zero.make(stage, model2, LocalComm(), lambda p: torch.optim.Adam(p, lr=0.01))
    opt2.load_full_state_dict(model_state, opt_state)
    for u, u2 in zip(sync.units, sync2.units, strict=True):
        assert torch.equal(u.shard, u2.shard)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[u.shard][key], opt2.state[u2.shard][key])
