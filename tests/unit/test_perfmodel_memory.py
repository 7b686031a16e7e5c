"""The ZeRO memory and communication formulas (mpi_sgd.perfmodel.memory): pure arithmetic, no processes."""

from __future__ import annotations

from fractions import Fraction

import pytest

from mpi_sgd.perfmodel import memory as mm

GB, GiB = 1e9, 2**30


def test_paper_figure_1():
    # Rajbhandari et al. 2020, Figure 1: Ψ = 7.5 B, N_d = 64, mixed-precision Adam (K = 12).
    totals = [mm.model_states(7_500_000_000, s, 64, "adam", "mixed").total / GB for s in mm.STAGES]
    assert [round(t, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]


def test_seed_fsdp_arithmetic():
    # The FSDP notebook: 7 B parameters in fp32 with Adam take 104.3 GB per GPU under DDP
    # (its "GB" are GiB) and 13.0 over 8 GPUs fully sharded.
    assert round(mm.model_states(7_000_000_000, 0, 8).total / GiB, 1) == 104.3
    assert round(mm.model_states(7_000_000_000, 3, 8).total / GiB, 1) == 13.0


@pytest.mark.parametrize(
    "optimizer, precision, want",
    [
        ("adam", "fp32", (4, 4, 8)),
        ("momentum", "fp32", (4, 4, 4)),
        ("sgd", "fp32", (4, 4, 0)),
        ("adam", "fp64", (8, 8, 16)),
        ("adam", "mixed", (2, 2, 12)),
        ("sgd", "mixed", (2, 2, 4)),
    ],
)
def test_constants(optimizer, precision, want):
    assert mm.constants(optimizer, precision) == want


def test_what_each_stage_shards():
    psi, R = 1000, 4
    s = [mm.model_states(psi, stage, R) for stage in mm.STAGES]
    assert (s[0].params, s[0].grads, s[0].optimizer) == (4000, 4000, 8000)
    assert (s[1].params, s[1].grads, s[1].optimizer) == (4000, 4000, 2000)
    assert (s[2].params, s[2].grads, s[2].optimizer) == (4000, 1000, 2000)
    assert (s[3].params, s[3].grads, s[3].optimizer) == (1000, 1000, 2000)
    # one rank holds everything, whatever the stage
    assert {mm.model_states(psi, stage, 1).total for stage in mm.STAGES} == {16000}


@pytest.mark.parametrize("stage", mm.STAGES)
@pytest.mark.parametrize("ranks", [1, 3, 8, 64])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_largest_model_fits_and_one_more_does_not(stage, ranks, optimizer):
    memory = 80 * GiB + 12345
    n = mm.largest_model(memory, stage, ranks, optimizer)
    p, g, k = mm.constants(optimizer)
    per = {0: p + g + k, 1: p + g + Fraction(k, ranks), 2: p + Fraction(g + k, ranks), 3: Fraction(p + g + k, ranks)}
    assert n * per[stage] <= memory < (n + 1) * per[stage]  # exact, in rationals


def test_largest_model_grows_with_sharding():
    sizes = [mm.largest_model(16 * GiB, stage, 8) for stage in mm.STAGES]
    assert sizes == sorted(sizes) and sizes[3] == 8 * sizes[0]


def test_communication_volume():
    assert [mm.comm_elements(100, s) for s in mm.STAGES] == [200, 200, 200, 300]
    assert mm.ring_bytes_sent(100, 3, 1) == 0  # one rank sends nothing
    assert mm.ring_bytes_sent(100, 0, 4) == 200 * 4 * 3 / 4


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: mm.model_states(10, 4, 2), "stage"),
        (lambda: mm.model_states(10, 1, 0), "ranks"),
        (lambda: mm.model_states(10, 1, 2, "lion"), "optimizer"),
        (lambda: mm.model_states(-1, 1, 2), "params"),
        (lambda: mm.model_states(10, 1, 2, "adam", "bf16"), "precision"),
        (lambda: mm.largest_model(float("inf"), 1, 2), "memory"),
    ],
)
def test_bad_input_says_what(call, message):
    with pytest.raises(ValueError, match=message):
        call()
