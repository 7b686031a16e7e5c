"""The pipeline's pure parts, no processes: cutting a model, schedules, the idealised machine, headers,
the activation meter and the timeline format. The distributed runs are in tests/mpi/test_pipeline.py."""

from __future__ import annotations

import importlib
import itertools
import json
import random

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.models import MLP, FFNet, LeNet
from mpi_sgd.pipeline import (
    SCHEDULES,
    ActivationMeter,
    Deadlock,
    PipelineError,
    PipelineStage,
    balance,
    cut,
    ideal_bubble,
    layers_of,
    partition,
    peak_in_flight,
    schedule,
    simulate,
)
from mpi_sgd.pipeline.schedule import bubble
from mpi_sgd.pipeline.stage import ACT_TAG, GRAD_TAG, decode_header, encode_header


# -- cutting ------------------------------------------------------------------------------------
def _brute_force(costs, parts):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), parts - 1):
        b = [0, *cuts, n]
        worst = max(sum(costs[b[k] : b[k + 1]]) for k in range(parts))
        best = worst if best is None else min(best, worst)
    return best


def test_balance_minimises_the_most_expensive_stage():
    assert balance([1.0] * 6, 3) == [0, 2, 4, 6]
    assert balance([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]
    assert balance([1, 2, 3], 1) == [0, 3]
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        costs = [rng.randint(0, 9) for _ in range(n)]
        parts = rng.randint(1, n)
        b = balance(costs, parts)
        assert b[0] == 0 and b[-1] == n and len(b) == parts + 1
        assert all(lo < hi for lo, hi in zip(b, b[1:], strict=False))  # no empty stage
        assert max(sum(costs[b[k] : b[k + 1]]) for k in range(parts)) == _brute_force(costs, parts)


@pytest.mark.parametrize("parts", [0, 4])
def test_balance_refuses_impossible_cuts(parts):
    with pytest.raises(ValueError, match="non-empty stage"):
        balance([1.0, 1.0, 1.0], parts)


@pytest.mark.parametrize(
    "model", [MLP((12, 7, 9, 3)), MLP((12, 7, 3), dropout=0.3).eval(), FFNet(12, num_hl=2, hl_size=6, num_outputs=2)]
)
def test_layers_compose_to_the_model_and_share_its_parameters(model):
    x = torch.randn(5, 3, 4)  # flattened by the model and by the first layer alike
    layers = layers_of(model)
    z = x
    for layer in layers:
        z = layer(z)
    assert torch.equal(z, model(x))
    assert {id(p) for layer in layers for p in layer.parameters()} == {id(p) for p in model.parameters()}


def test_layers_of_a_model_that_is_not_a_sequence_is_refused():
    with pytest.raises(TypeError, match="cannot cut a LeNet"):
        layers_of(LeNet())


def test_splits_by_params_and_by_time():
    layers = layers_of(MLP((64, 64, 4, 4, 4, 4)))  # one big layer, four tiny ones
    assert partition(layers, 2, "layers") == [0, 2, 5]
    assert partition(layers, 2, "params") == [0, 1, 5]
    bounds = partition(layers, 2, "time", sample=torch.randn(8, 64), comm=LocalComm())
    assert bounds[0] == 0 and bounds[-1] == 5 and len(bounds) == 3
    assert all(p.grad is None for layer in layers for p in layer.parameters())  # timing left no gradients
    with pytest.raises(ValueError, match="needs the communicator"):
        partition(layers, 2, "time", sample=torch.randn(8, 64))
    with pytest.raises(ValueError, match="unknown split 'flops'"):
        partition(layers, 2, "flops")


# -- schedules ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SCHEDULES)
def test_every_schedule_runs_each_forward_before_its_backward(name):
    for stages, m in itertools.product(range(1, 6), range(1, 9)):
        for s in range(stages):
            ops = schedule(name, s, stages, m)
            assert sorted(map(str, ops)) == sorted([f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)])
            assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(m))
            assert [op.mb for op in ops if op.kind == "F"] == list(range(m))  # links stay in order


def test_1f1b_warms_up_alternates_and_cools_down():
    got = [str(op) for op in schedule("1f1b", 0, 4, 8)]
    assert got == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7".split()
    assert [str(op) for op in schedule("1f1b", 3, 4, 3)] == "F0 B0 F1 B1 F2 B2".split()
    assert [str(op) for op in schedule("gpipe", 1, 4, 3)] == "F0 F1 F2 B2 B1 B0".split()


def test_activations_held_gpipe_m_1f1b_at_most_stages_left():
    for stages, m in itertools.product(range(1, 6), range(1, 9)):
        for s in range(stages):
            assert peak_in_flight(schedule("gpipe", s, stages, m)) == m
            assert peak_in_flight(schedule("1f1b", s, stages, m)) == min(stages - s, m)


@pytest.mark.parametrize("bad", [("zigzag", 0, 2, 2), ("gpipe", 2, 2, 2), ("1f1b", 0, 2, 0)])
def test_schedule_refuses_bad_arguments(bad):
    with pytest.raises(ValueError):
        schedule(*bad)


# -- the idealised machine --------------------------------------------------------------------
@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("t_f, t_b", [(1.0, 1.0), (1.0, 2.0), (0.3, 1.7)])
def test_bubble_is_r_minus_1_over_m_plus_r_minus_1(name, t_f, t_b):
    """GPipe's formula holds for both schedules whatever the forward/backward ratio."""
    for stages, m in itertools.product(range(1, 6), (1, 2, 3, 4, 8)):
        assert bubble(simulate(name, stages, m, t_f, t_b)) == pytest.approx(ideal_bubble(stages, m), abs=1e-12)


def test_per_stage_costs_a_slow_stage_sets_the_pace():
    even = simulate("gpipe", 3, 4, [1.0] * 3, [2.0] * 3)
    assert even == simulate("gpipe", 3, 4, 1.0, 2.0)
    # GPipe with one stage twice as slow: its 4 forwards and 4 backwards set the pace, and the
    # others wait on it, so the bubble rises above (R-1)/(m+R-1).
    slow = simulate("gpipe", 3, 4, [1.0, 2.0, 1.0], [2.0, 4.0, 2.0])
    assert max(end for _, _, end in slow[0]) == 1 + 4 * 2 + 1 + 2 + 4 * 4 + 2  # = 30: fill, slow stage, drain
    assert bubble(slow) > ideal_bubble(3, 4)


def test_non_blocking_sends_never_deadlock_and_blocking_ones_do_in_1f1b():
    for stages, m in itertools.product(range(1, 7), range(1, 10)):
        for name in SCHEDULES:
            simulate(name, stages, m)  # the runtime's way: isend, blocking recv
        simulate("gpipe", stages, m, blocking_sends=True)  # each link: all activations, then all gradients
        if stages >= 2 and m >= 2:
            # steady state: stage R-2 sends activation 1 forward while stage R-1 sends gradient 0 back
            with pytest.raises(Deadlock, match=r"stage \d+ at \('send'"):
                simulate("1f1b", stages, m, blocking_sends=True)


# -- headers, memory, timeline ------------------------------------------------------------------
def test_header_round_trip_and_limits():
    t = torch.zeros(3, 5, dtype=torch.float64)
    meta, dtype, shape = decode_header(encode_header(7, 2, 4, GRAD_TAG, t))
    assert (meta, dtype, shape) == ((7, 2, 4, GRAD_TAG), torch.float64, (3, 5))
    assert decode_header(encode_header(0, 0, 1, ACT_TAG, torch.zeros(2, 0)))[2] == (2, 0)
    with pytest.raises(PipelineError, match="cannot send a torch.bfloat16"):
        encode_header(0, 0, 1, ACT_TAG, t.bfloat16())
    with pytest.raises(PipelineError, match="malformed"):
        decode_header(torch.full((12,), 99, dtype=torch.int64))


def test_activation_meter_counts_saved_activations_once_and_frees_them():
    lin1, lin2 = nn.Linear(10, 20).double(), nn.Linear(20, 3).double()
    meter = ActivationMeter([*lin1.parameters(), *lin2.parameters()])
    x = torch.randn(4, 10, dtype=torch.float64)
    with meter.hooks():
        loss = lin2(torch.relu(lin1(x))).sum()
    # lin1 saves x (4x10); relu saves its output, which lin2 saves as input (4x20, counted once)
    assert meter.now == meter.peak == 8 * (4 * 10 + 4 * 20)
    loss.backward()
    del loss
    assert meter.now == 0 and meter.peak == 8 * 120


def test_world_size_1_stage_is_the_whole_model_and_writes_a_trace():
    torch.manual_seed(0)
    model, ref = MLP((6, 8, 8, 3)).double(), MLP((6, 8, 8, 3)).double()
    ref.load_state_dict(model.state_dict())
    comm = LocalComm()
    module, bounds = cut(model, comm)
    assert bounds == [0, 3]
    stage = PipelineStage(comm, module, F.cross_entropy, "gpipe", micro_batches=1, timeline=True)
    x, y = torch.randn(5, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    loss = stage.forward_backward(x, y)
    reference = F.cross_entropy(ref(x), y)
    reference.backward()
    # m = 1 runs exactly the unsplit model's operations: bit for bit
    assert loss == reference.item()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), ref.parameters(), strict=True))
    trace = json.loads(json.dumps(stage.timeline()))
    assert [(e["name"], e["ph"], e["tid"]) for e in trace["traceEvents"]] == [("F0", "X", 0), ("B0", "X", 0)]
    with pytest.raises(ValueError, match="cannot be cut into 2 micro-batches"):
        PipelineStage(comm, module, F.cross_entropy, "1f1b", micro_batches=2).forward_backward(x[:1], y[:1])


def test_a_loss_that_is_not_finite_stops_the_step_before_its_backward():
    torch.manual_seed(0)
    module, _ = cut(MLP((6, 8, 3)).double(), LocalComm())
    stage = PipelineStage(LocalComm(), module, F.cross_entropy, "gpipe", micro_batches=2)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    x[3, 0] = float("nan")  # the second micro-batch's loss is nan
    with pytest.raises(PipelineError, match="stage 0: the loss of micro-batch 1 at step 0 is nan"):
        stage.forward_backward(x, y)
    assert all(p.grad is None for p in module.parameters())  # GPipe: no backward ran, nothing to step on


def test_the_diagrams_in_the_docs_are_what_simulate_lays_out():
    def rows(name):
        out = []
        for ops in simulate(name, 3, 4, 1.0, 1.0):
            slots = [".  "] * 12
            for op, start, _ in ops:
                slots[int(start)] = f"{op} "
            out.append("".join(slots).rstrip())
        return out

    doc = importlib.import_module("mpi_sgd.pipeline.schedule").__doc__
    for name in SCHEDULES:
        for s, row in enumerate(rows(name)):
            assert f"stage {s}: {row}\n" in doc, (name, s, row)
