"""Least-squares calibration recovers known α, β, γ; calibration files round-trip; argparse types."""

import argparse
import random

import pytest

from mpi_sgd import args as argtypes
from mpi_sgd import perfmodel as pm
from mpi_sgd.calibrate import (
    Calibration,
    StepTiming,
    SweepPoint,
    SweepRefused,
    fit_line,
    fit_network,
    measure_gamma,
    measure_step,
    sweep_sizes,
)

TRUE = pm.Network(alpha=5e-6, beta=2e-10, gamma=5e-11)
SIZES = sweep_sizes(4, 64 << 20)


def synthetic(net, algorithm, ranks, noise=0.0, seed=0):
    """Sweep points as the model says they would be measured, with optional multiplicative noise."""
    rng = random.Random(seed)
    points = []
    for p in ranks:
        for n in SIZES:
            t = net.time(pm.allreduce_coefficients(algorithm, n, p)) * (1 + rng.uniform(-noise, noise))
            points.append(SweepPoint(n, p, t, t, t, algorithm))
    return points


def test_fit_recovers_alpha_beta_with_known_gamma():
    net = fit_network(synthetic(TRUE, "ring", [2, 4]), gamma=TRUE.gamma)
    assert net.alpha == pytest.approx(TRUE.alpha, rel=1e-6)
    assert net.beta == pytest.approx(TRUE.beta, rel=1e-6)
    assert net.gamma == TRUE.gamma


def test_fit_tolerates_noise():
    # ±5% per point, as on a shared machine: the fit over 12 sizes lands within 10%.
    net = fit_network(synthetic(TRUE, "ring", [2], noise=0.05, seed=1), gamma=TRUE.gamma)
    assert net.alpha == pytest.approx(TRUE.alpha, rel=0.1)
    assert net.beta == pytest.approx(TRUE.beta, rel=0.1)


def test_fit_recovers_all_three_from_two_algorithms():
    # Recursive doubling reduces as many bytes as it sends; the ring half as many: β and γ separate.
    points = synthetic(TRUE, "ring", [4]) + synthetic(TRUE, "recursive_doubling", [4, 8])
    net = fit_network(points)
    assert net.alpha == pytest.approx(TRUE.alpha, rel=1e-6)
    assert net.beta == pytest.approx(TRUE.beta, rel=1e-6)
    assert net.gamma == pytest.approx(TRUE.gamma, rel=1e-6)


def test_ring_alone_cannot_separate_beta_and_gamma():
    with pytest.raises(ValueError, match="told apart"):
        fit_network(synthetic(TRUE, "ring", [2, 4, 8]))


def test_gamma_zero_gives_an_effective_beta():
    # Ring at p: β·2(p−1)/p·n + γ·(p−1)/p·n = (β + γ/2)·2(p−1)/p·n.
    net = fit_network(synthetic(TRUE, "ring", [2]), gamma=0.0)
    assert net.beta == pytest.approx(TRUE.beta + TRUE.gamma / 2, rel=1e-6)


def test_fitted_values_are_never_negative():
    bandwidth_only = pm.Network(alpha=0.0, beta=1e-9)
    net = fit_network(synthetic(bandwidth_only, "ring", [2], noise=0.2, seed=3), gamma=0.0)
    assert net.alpha >= 0 and net.beta > 0


def _sweep_64k(times_us):
    seconds = [t * 1e-6 for t in times_us]
    return [SweepPoint(n, 2, t, t, t) for n, t in zip(sweep_sizes(4, 64 << 10), seconds, strict=True)]


def test_a_sweep_without_a_cost_per_byte_is_refused():
    # A short sweep on a loaded machine: the largest all-reduces took no longer than the small ones.
    # β would fit to 0, and a network saved with it prices every model's gradients at α alone.
    flat = _sweep_64k([9.6, 10.8, 11.1, 10.8, 10.6, 11.8, 12.0, 11.0])  # µs at 4 B .. 64 KiB
    with pytest.raises(SweepRefused, match=r"up to 64 KiB showed no cost per byte"):
        fit_network(flat, gamma=1.1e-10)
    quiet = _sweep_64k([9.6, 10.8, 11.1, 10.8, 10.6, 11.8, 18.2, 26.7])  # the same sweep measured here, quiet
    assert fit_network(quiet, gamma=1.1e-10).beta > 0


def test_fit_needs_real_timings():
    with pytest.raises(ValueError):
        fit_network([SweepPoint(4, 2, 1e-6, 1e-6, 1e-6)])
    with pytest.raises(ValueError, match="positive"):
        fit_network([SweepPoint(4, 2, 0.0, 0.0, 0.0), SweepPoint(8, 2, 0.0, 0.0, 0.0)])
    with pytest.raises(ValueError, match="two or more ranks"):
        fit_network([SweepPoint(4, 1, 1e-7, 1e-7, 1e-7), SweepPoint(8, 1, 1e-7, 1e-7, 1e-7)])


def test_fit_line():
    xs = [1e3, 1e4, 1e5, 1e6]
    a, b = fit_line(xs, [2e-6 + 3e-10 * x for x in xs])
    assert a == pytest.approx(2e-6) and b == pytest.approx(3e-10)


def test_calibration_round_trips_through_json(tmp_path):
    cal = Calibration(
        pm.Network(4e-6, 3e-10, 1e-10, "measured"),
        "ring",
        StepTiming(0.01, 64, 1000, "mlp 8-8"),
        (SweepPoint(4, 2, 1e-6, 2e-6, 3e-6), SweepPoint(1024, 2, 2e-6, 3e-6, 4e-6)),
        {"host": "h", "ranks": 2},
    )
    loaded = Calibration.load(cal.save(tmp_path / "c.json"))
    assert loaded == cal
    assert loaded.compute() == pm.Compute(0.01, 64)
    assert loaded.step.grad_bytes == 4000


def test_loading_something_else_fails(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a calibration"):
        Calibration.load(path)


def test_presets_are_ordered_by_speed():
    t = {name: net.time(pm.ring_allreduce(4 << 20, 8)) for name, net in pm.PRESETS.items()}
    assert t["1gbe"] > t["10gbe"] > t["ib100"] > t["nvlink"]


def test_measurements_at_tiny_sizes():
    assert measure_gamma(sizes=(1 << 12, 1 << 14, 1 << 16), repeats=3) >= 0
    step = measure_step((8, 16, 4), batch=4, warmup=1, iterations=3, min_seconds=0)
    assert step.seconds > 0 and step.params == 8 * 16 + 16 + 16 * 4 + 4 and step.model == "mlp 8-16-4"


def test_sweep_sizes():
    assert sweep_sizes(4, 1024) == [4, 16, 64, 256, 1024]


@pytest.mark.parametrize(
    "fn, text, value",
    [
        (argtypes.nbytes, "16MiB", 16 << 20),
        (argtypes.nbytes, "64 KB", 64 << 10),
        (argtypes.nbytes, "4096", 4096),
        (argtypes.positive_ints, "784,1024,1024,10", [784, 1024, 1024, 10]),  # layer widths repeat
        (argtypes.rank_list, "8,1,2,4,2", [1, 2, 4, 8]),
        (argtypes.nonneg_float, "0", 0.0),
        (argtypes.positive_float, "1e-3", 1e-3),
    ],
)
def test_argtypes_accept(fn, text, value):
    assert fn(text) == value


@pytest.mark.parametrize(
    "fn, text",
    [
        (argtypes.nbytes, "lots"),
        (argtypes.nbytes, "-4"),
        (argtypes.positive_ints, "1,0"),
        (argtypes.positive_ints, ","),
        (argtypes.positive_int, "2.5"),
        (argtypes.nonneg_float, "-1"),
        (argtypes.nonneg_float, "nan"),
        (argtypes.positive_float, "0"),
    ],
)
def test_argtypes_reject(fn, text):
    with pytest.raises(argparse.ArgumentTypeError):
        fn(text)


def test_mpiexec_command_drops_the_enclosing_job(monkeypatch):
    import sys

    from mpi_sgd.launch import mpiexec_command

    monkeypatch.setenv("MPI_SGD_MPIEXEC", "/opt/mpi/bin/mpiexec --oversubscribe")
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    cmd, env = mpiexec_command(2, "-m", "mpi_sgd.calibrate")
    assert cmd == ["/opt/mpi/bin/mpiexec", "--oversubscribe", "-n", "2", sys.executable, "-m", "mpi_sgd.calibrate"]
    assert "PMI_RANK" not in env and "OMPI_COMM_WORLD_SIZE" not in env and env["MPI_SGD_MPIEXEC"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: SweepPoint(0, 2, 1e-6, 1e-6, 1e-6),
        lambda: SweepPoint(4, 2, 2e-6, 1e-6, 3e-6),  # min above avg
        lambda: SweepPoint(4, 2, 1e-6, 1e-6, 1e-6, "tree"),
        lambda: StepTiming(0.0, 64, 1000, "mlp"),
        lambda: StepTiming(0.01, 0, 1000, "mlp"),
    ],
)
def test_measurements_are_validated(make):
    with pytest.raises(ValueError):
        make()


def test_fit_takes_bandwidth_from_the_large_end():
    # Two regimes, as MPI's eager and rendezvous protocols give: large messages pay 40% more per
    # byte. One line through all sizes would follow the many small points; the fit must predict
    # a gradient-sized all-reduce within a few percent and keep the small-message latency.
    small, large = pm.Network(5e-6, 2e-10, 0.0), pm.Network(5e-6, 2.8e-10, 0.0)
    points = []
    for n in SIZES:
        net = large if n >= 256 << 10 else small
        t = net.time(pm.ring_allreduce(n, 2))
        points.append(SweepPoint(n, 2, t, t, t, "ring"))
    net = fit_network(points, gamma=0.0)
    grad = 7_500_000
    assert net.time(pm.ring_allreduce(grad, 2)) == pytest.approx(large.time(pm.ring_allreduce(grad, 2)), rel=0.03)
    assert net.alpha == pytest.approx(5e-6, rel=0.1)
