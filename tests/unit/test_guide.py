"""The strategy guide's arithmetic (mpi_sgd/guide.py) and its calculator (examples/which_strategy.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_sgd import guide
from mpi_sgd.perfmodel import PRESETS, Network
from tests.helpers import standalone_env

ROOT = Path(__file__).resolve().parents[2]
FAST = Network(1e-6, 1e-10, 0.0, "fast")
SLOW = Network(50e-6, 1 / 117e6, 0.0, "1 GbE")


def problem(**kw) -> guide.Problem:
    base = dict(params=10**9, memory=64 * 2**30, network=FAST, ranks=8, optimizer="adam")
    return guide.Problem(**{**base, **kw})


def test_model_state_follows_the_zero_paper_in_float32():
    # Adam in float32: 4 bytes of parameters, 4 of gradients, 8 of state per parameter: 16P
    # unsharded; ZeRO shards the state (stage 1), then the gradients (2), then the parameters (3).
    p, P, R = problem(), 10**9, 8
    assert guide.model_state("data parallel", p) == 16 * P
    assert guide.model_state("ZeRO-1", p) == 8 * P + 8 * P / R
    assert guide.model_state("ZeRO-2", p) == 4 * P + 12 * P / R
    assert guide.model_state("ZeRO-3", p) == guide.model_state("pipeline", p) == 16 * P / R
    # a server keeps its slice, its optimizer state and a receive + reply buffer per worker
    assert guide.model_state("parameter server", problem(servers=2)) == (4 + 8 + 8 * 6) * P / 2


def test_the_simplest_strategy_that_fits_is_chosen():
    assert guide.recommend(problem(memory=20 * 2**30))[0] == "data parallel"  # 16 GB fit
    assert guide.recommend(problem(memory=10 * 2**30))[0] == "ZeRO-1"  # 9 GB
    assert guide.recommend(problem(memory=6 * 2**30))[0] == "ZeRO-2"  # 5.5 GB
    assert guide.recommend(problem(memory=3 * 2**30))[0] == "ZeRO-3"  # 2 GB
    choice, _, why = guide.recommend(problem(memory=1 * 2**30))
    assert choice == "none" and "nothing fits" in why


def test_a_straggler_on_a_fast_network_favours_the_parameter_server():
    small = dict(params=10**6, memory=2**30, optimizer="momentum", t_comp=0.01, network=FAST)
    assert guide.recommend(problem(**small))[0] == "data parallel"
    choice, estimates, why = guide.recommend(problem(**small, slowdown=4))
    assert choice == "parameter server" and "faster" in why
    by = {e.strategy: e for e in estimates}
    # 7 workers: 6 at one gradient per 10 ms and one at 40 ms, each plus its push and pull (2 us of
    # latency, 8 MB at 10 GB/s), against 8 gradients per 40 ms plus one all-reduce
    comm = 2e-6 + 8e6 * 1e-10
    assert by["parameter server"].gradients_per_s == pytest.approx(6 / (0.01 + comm) + 1 / (0.04 + comm))
    assert by["data parallel"].gradients_per_s == pytest.approx(8 / (0.04 + 14e-6 + 2 * 7 / 8 * 4e6 * 1e-10))


def test_the_parameter_server_is_server_bound_on_a_slow_network():
    est = guide.estimate("parameter server", problem(params=10**7, optimizer="sgd", t_comp=0.01, network=SLOW))
    assert est.note == "server-bound"
    # every gradient crosses the one server's link twice: 2 x 40 MB at 117 MB/s
    assert 1 / est.gradients_per_s == pytest.approx(2 * 50e-6 + 8e7 / 117e6, rel=1e-6)


def test_distribution_that_does_not_pay_is_called_out():
    _, _, why = guide.recommend(problem(params=25 * 10**6, optimizer="momentum", t_comp=0.05, network=SLOW, ranks=16))
    assert "distribution does not pay" in why


def which_strategy(*args: str) -> subprocess.CompletedProcess:
    """examples/which_strategy.py with ``args``, as a user runs it: one process of its own."""
    cmd = [sys.executable, str(ROOT / "examples" / "which_strategy.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=standalone_env())


def test_calculator_prints_the_table_and_a_choice():
    proc = which_strategy(
        *("--params", "1863690", "--memory", "1GiB", "--network", "10gbe", "--ranks", "8", "--t-comp", "0.01")
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for strategy in guide.STRATEGIES:
        assert re.search(rf"^\|\s+{strategy} \|", out, re.MULTILINE), out
    assert out.strip().splitlines()[-1].startswith("use: data parallel:")


def test_calculator_refuses_a_network_without_numbers():
    proc = which_strategy("--params", "10", "--memory", "1GiB", "--ranks", "2")
    assert proc.returncode == 2 and "give --network or --alpha and --beta" in proc.stderr


def test_past_the_critical_batch_data_parallel_counts_at_its_worth_to_accuracy():
    # 16 ranks x batch 32 = 512 against B_noise 50: R gradients per step buy S(32)/S(512) = 2.34
    # one-rank steps, not 16 (rel 1e-9: a product of a few floats).
    base = dict(params=1_863_690, memory=2**30, network=PRESETS["10gbe"], ranks=16, t_comp=0.01)
    plain = guide.estimate("data parallel", guide.Problem(**base))
    noisy = guide.estimate("data parallel", guide.Problem(**base, b_noise=50.0, batch=32))
    worth = (1 + 50 / 32) / (16 * (1 + 50 / 512))
    assert noisy.gradients_per_s == pytest.approx(plain.gradients_per_s * worth, rel=1e-9)
    assert (
        guide.estimate("pipeline", guide.Problem(**base, b_noise=50.0)).note
        == guide.estimate("pipeline", guide.Problem(**base)).note
    )  # the pipeline keeps the batch: nothing to weigh
    _, _, why = guide.recommend(guide.Problem(**base, b_noise=50.0, batch=32))
    assert "distribution does not pay here" in why
    _, _, why = guide.recommend(guide.Problem(**base))
    assert "does not pay" not in why  # per gradient, without the noise scale, it does
