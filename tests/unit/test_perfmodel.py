"""The performance model's formulas against [S-SGD] and hand-computed α-β-γ costs."""

import math
import random

import pytest

from mpi_sgd import perfmodel as pm
from mpi_sgd.report import markdown_table


# -- [S-SGD]: break-even ---------------------------------------------------------------------
def at(t_comp, t_sync, ranks):
    """The weak-scaling row at R = ``ranks`` for a fixed T_comp and T_sync: [S-SGD]'s law."""
    return pm.scaling(pm.Compute(t_comp), pm.FixedSync(t_sync), [ranks], samples=1000, batch=10)[0]


def first_paying(t_comp, t_sync):
    return next(r for r in range(1, 100) if at(t_comp, t_sync, r).pays)


def test_break_even_is_exact():
    # T_sync = T_comp: R = 2 only breaks even, R = 3 gains half a process.
    assert at(1.0, 1.0, 2).speedup == 1.0
    assert at(1.0, 1.0, 3).speedup == 1.5
    assert not at(1.0, 1.0, 2).pays
    assert at(1.0, 1.0, 3).pays
    assert first_paying(1.0, 1.0) == 3
    assert first_paying(1.0, 0.5) == 2
    assert first_paying(2.0, 7.0) == 5  # ratio 3.5: needs R − 1 > 3.5


@pytest.mark.parametrize("args", [(0.0, 1.0, 2), (-1.0, 1.0, 2), (1.0, -1.0, 2), (1.0, 1.0, 0), (1.0, math.inf, 2)])
def test_nonsense_is_rejected(args):
    with pytest.raises(ValueError):
        at(*args)


def test_one_rank_is_the_baseline():
    assert at(1.0, 5.0, 1).speedup == 1.0
    assert not at(1.0, 0.0, 1).pays


def test_pays_agrees_with_the_ratio_test_and_the_speedup():
    rng = random.Random(0)
    for _ in range(2000):
        t_comp, t_sync, r = rng.uniform(0.01, 2), rng.uniform(0, 5), rng.randint(2, 64)
        row = at(t_comp, t_sync, r)
        assert row.pays == (t_sync / t_comp < r - 1)
        if abs(t_sync / t_comp - (r - 1)) > 1e-9:  # away from the line, rounding cannot flip it
            assert row.pays == (row.speedup > 1)
        assert row.speedup == pytest.approx(r * t_comp / (t_comp + t_sync))


def test_weak_scaling_table_matches_seed_003():
    points = pm.scaling(pm.Compute(1.0, 64), pm.FixedSync(1.0), [1, 2, 3, 4], samples=60_000, batch=64)
    assert [p.speedup for p in points] == [1.0, 1.0, 1.5, 2.0]
    assert [p.pays for p in points] == [False, False, True, True]
    assert [p.efficiency for p in points] == [1.0, 0.5, 0.5, 0.5]
    # T_epoch = N/(R·B)·(T_comp + T_sync), and no sync at one rank.
    assert points[0].t_epoch == pytest.approx(60_000 / 64 * 1.0)
    assert points[3].t_epoch == pytest.approx(60_000 / (4 * 64) * 2.0)
    assert points[0].t_sync == 0.0


def test_strong_scaling_splits_the_global_batch():
    points = pm.scaling(pm.Compute(1.0, 64), pm.FixedSync(1.0), [1, 4], samples=6400, batch=64, mode="strong")
    four = points[1]
    assert four.per_rank_batch == 16
    assert four.t_comp == pytest.approx(0.25)
    assert four.steps == pytest.approx(100)  # N/B, however many ranks
    assert four.speedup == pytest.approx(1 / 1.25)
    assert not four.pays


def test_fixed_part_of_the_step_does_not_shrink():
    c = pm.Compute(t_comp=1.0, batch=10, t_fixed=0.2)
    assert c.at_batch(10) == pytest.approx(1.0)
    assert c.at_batch(5) == pytest.approx(0.6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: pm.Compute(0.0),
        lambda: pm.Compute(-1.0),
        lambda: pm.Compute(1.0, batch=0),
        lambda: pm.Compute(1.0, t_fixed=2.0),
        lambda: pm.FixedSync(-0.1),
        lambda: pm.FixedSync(math.nan),
        lambda: pm.Network(alpha=-1e-6, beta=1e-9),
        lambda: pm.Network(alpha=1e-6, beta=math.inf),
        lambda: pm.Network.from_link(1e-6, 0.0),
        lambda: pm.AllreduceSync(pm.Network(0, 0), 100, "tree"),
        lambda: pm.scaling(pm.Compute(1.0), pm.FixedSync(1.0), [0, 2], 100, 10),
        lambda: pm.scaling(pm.Compute(1.0), pm.FixedSync(1.0), [16], 100, 8, mode="strong"),
        lambda: pm.scaling(pm.Compute(1.0), pm.FixedSync(1.0), [2], 100, 8, mode="sideways"),
    ],
)
def test_bad_values_fail_on_construction(make):
    with pytest.raises(ValueError):
        make()


# -- α-β-γ costs, by hand ---------------------------------------------------------------------
def C(latency, bandwidth, compute=0.0):
    return pm.Coefficients(latency, bandwidth, compute)


@pytest.mark.parametrize(
    "algorithm, n, p, expected",
    [
        # ring: 2(p−1), 2(p−1)/p·n, (p−1)/p·n
        ("ring", 1000, 4, C(6, 1500, 750)),
        ("ring", 900, 3, C(4, 1200, 600)),
        # recursive doubling: lg p of everything; p = 6 folds to 4 plus (2, 2n, n)
        ("recursive_doubling", 1000, 8, C(3, 3000, 3000)),
        ("recursive_doubling", 1000, 6, C(4, 4000, 3000)),
        # Rabenseifner: 2 lg p, 2(p−1)/p·n, (p−1)/p·n; p = 5 folds to 4 plus (2, 2n, n)
        ("rabenseifner", 800, 8, C(6, 1400, 700)),
        ("rabenseifner", 800, 5, C(6, 2800, 1400)),
    ],
)
def test_allreduce_costs_by_hand(algorithm, n, p, expected):
    got = pm.allreduce_coefficients(algorithm, n, p)
    assert got.latency == expected.latency
    assert got.bandwidth == pytest.approx(expected.bandwidth)
    assert got.compute == pytest.approx(expected.compute)


def test_costs_in_seconds():
    net = pm.Network(alpha=1e-6, beta=1e-9, gamma=1e-10)
    assert net.time(pm.ring_allreduce(1000, 4)) == pytest.approx(6e-6 + 1.5e-6 + 7.5e-8)


@pytest.mark.parametrize("algorithm", pm.ALLREDUCE_ALGORITHMS)
def test_one_rank_costs_nothing(algorithm):
    assert pm.allreduce_coefficients(algorithm, 10**6, 1) == C(0, 0, 0)


def test_bandwidth_lower_bound():
    """Patarasuk & Yuan: no all-reduce sends less than 2(p−1)/p·n; ring and Rabenseifner meet it."""
    for p in (2, 4, 8, 16):
        bound = 2 * (p - 1) / p * 1000
        assert pm.ring_allreduce(1000, p).bandwidth == pytest.approx(bound)
        assert pm.rabenseifner_allreduce(1000, p).bandwidth == pytest.approx(bound)
        assert pm.recursive_doubling_allreduce(1000, p).bandwidth >= bound
    for p in range(2, 20):
        bound = 2 * (p - 1) / p * 1000
        for name in pm.ALLREDUCE_ALGORITHMS:
            assert pm.allreduce_coefficients(name, 1000, p).bandwidth >= bound


def test_ring_and_rabenseifner_agree_at_two_ranks():
    assert pm.ring_allreduce(4096, 2) == pm.rabenseifner_allreduce(4096, 2)


def test_allreduce_sync_is_zero_at_one_rank_and_grows_with_r():
    sync = pm.AllreduceSync(pm.Network(1e-6, 1e-9), nbytes=4_000_000)
    assert sync(1) == 0.0
    assert 0 < sync(2) < sync(4) < sync(8)


# -- presenting -------------------------------------------------------------------------------
def test_table_rows_print_the_seed_figures():
    points = pm.scaling(pm.Compute(1.0, 64), pm.FixedSync(1.0), [1, 2, 3], 60_000, 64)
    rows = pm.table_rows(points)
    assert [r[6] for r in rows] == ["1.00", "1.00", "1.50"]
    assert [r[8] for r in rows] == ["baseline", "no", "yes"]
    table = markdown_table(pm.TABLE_HEADERS, rows)
    assert table.count("\n") == 4 and table.startswith("| R |")


def test_plot_writes_a_png(tmp_path):
    points = pm.scaling(pm.Compute(1.0), pm.FixedSync(0.2), [1, 2, 4], 1000, 10)
    path = pm.plot_scaling(points, tmp_path / "s.png", "test")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_perfmodel_imports_neither_mpi_nor_torch():
    import subprocess
    import sys

    # ... nor does reading a calibration: the speedup calculator imports both, and starting torch
    # would cost every run of it seconds.
    code = (
        "import sys, mpi_sgd.perfmodel, mpi_sgd.calibrate, mpi_sgd.report; "
        "print(sorted(m for m in ('mpi4py', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_allreduce_sync_row_by_hand():
    # 1 MB of gradients, ring at R = 4 over α = 10 us, β = 1 ns/B: 6·10 us + 1.5e6 B·1 ns = 1.56 ms.
    sync = pm.AllreduceSync(pm.Network(10e-6, 1e-9), nbytes=10**6)
    (four,) = pm.scaling(pm.Compute(0.01), sync, [4], samples=1000, batch=10)
    assert four.t_sync == pytest.approx(1.56e-3)
    assert four.speedup == pytest.approx(4 * 0.01 / (0.01 + 1.56e-3))
