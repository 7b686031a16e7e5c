"""The docs' figures drawn from small records: each has the artists, labels and data it should.

No processes: every record here is written out by hand (or by the textbook schedule), small
enough to check each bar and line against the number it must show.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mpi_sgd import perfmodel as pm
from mpi_sgd.figures import allreduce, pipeline, ring, speedup, staleness, timeline, zero
from mpi_sgd.figures.provenance import Provenance, save
from mpi_sgd.perfmodel import memory as memmodel
from mpi_sgd.pipeline import ideal_bubble
from tests.helpers import textbook_ring


# -- the ring --------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 4])
def test_ring_code_the_data_names_chunk_and_contributors(p):
    # Any sum of some ranks' copies of one chunk decodes to that chunk and exactly those ranks.
    rng = np.random.default_rng(p)
    for chunk in range(p):
        members = sorted(int(r) for r in rng.choice(p, size=rng.integers(1, p + 1), replace=False))
        total = sum(np.split(ring.encode(r, p), p)[chunk] for r in members)
        assert ring.decode(total, p) == (chunk, members)
    with pytest.raises(ValueError, match="not one chunk"):
        ring.decode(np.array([3, 5]), p)  # two chunks' worth of different values


def test_ring_replay_follows_the_textbook_and_ends_complete():
    states = ring.replay(textbook_ring(3))
    assert len(states) == 1 + 2 * 2
    assert states[0][1] == [frozenset({1})] * 3
    # after the reduce-scatter rank r holds chunk r+1 complete (and nothing else complete)
    for r in range(3):
        assert [c for c in range(3) if len(states[2][r][c]) == 3] == [(r + 1) % 3]
    assert all(c == frozenset({0, 1, 2}) for row in states[-1] for c in row)


def test_ring_replay_refuses_a_record_the_ring_did_not_make():
    rec = textbook_ring(3)
    rec["steps"][1]["sends"][0]["holds"] = [0]  # rank 0 claims to send a chunk it had not summed yet
    with pytest.raises(ValueError, match="rank 0 sent chunk"):
        ring.replay(rec)
    rec = textbook_ring(3)
    rec["result"][2][1] = [1, 2]  # a final buffer missing rank 0's share
    with pytest.raises(ValueError, match="final buffers"):
        ring.replay(rec)


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


@pytest.mark.parametrize("p", [1, 3])
def test_ring_figure_has_a_grid_per_step_with_arrows_and_marks(p):
    from matplotlib.patches import FancyArrowPatch, Rectangle

    fig = ring.draw(textbook_ring(p))
    grids = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in grids] == ["start: each rank its own data"] + [
        f"{phase} step {s}" for phase in ("reduce-scatter", "all-gather") for s in range(1, p)
    ]
    for i, ax in enumerate(grids):
        cells = [a for a in ax.patches if isinstance(a, Rectangle)]
        arrows = [a for a in ax.patches if isinstance(a, FancyArrowPatch)]
        assert len(cells) == p * p and len(_texts(ax)) == p * p
        # p sends a step; the wrap from the last rank to rank 0 is drawn as two legs
        assert len(arrows) == (0 if i == 0 else p + 1)
        assert sum(c.get_edgecolor()[:3] != (1.0, 1.0, 1.0) for c in cells) == (0 if i == 0 else p)
    assert _texts(grids[-1]) == ["Σ"] * (p * p)  # everyone holds everything at the end
    if p == 3:
        assert sorted(_texts(grids[0])) == sorted(["0", "1", "2"] * 3)
        assert "1+2" in _texts(grids[1]) and "0+1+2" not in _texts(grids[1])


# -- the bucketed step's timeline ------------------------------------------------------------
def _trace(spans_ms: list[float], ranks: int = 2) -> dict:
    """Steps of forward 10, backward 20, optimizer 5 ms, two buckets started in backward;
    step i is stretched to ``spans_ms[i]`` by a late optimizer."""
    events = []
    for rank in range(ranks):
        t = 0.0
        for span in spans_ms:
            ms = [
                ("forward", t, 10),
                ("backward", t + 10, 20),
                ("allreduce[0]", t + 15, 10),  # entirely under backward
                ("allreduce[1]", t + 25, 10),  # half under backward
                ("optimizer", t + span - 5, 5),
            ]
            events += [{"name": n, "ph": "X", "pid": 0, "tid": rank, "ts": 1e3 * a, "dur": 1e3 * d} for n, a, d in ms]
            t += span
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def test_timeline_cuts_steps_and_picks_the_median_one_after_warmup():
    trace = _trace([100, 40, 60, 50, 70])
    steps = timeline.steps_by_rank(trace)
    assert [len(s) for s in steps[0]] == [5] * 5
    assert timeline.pick_step(steps, warmup=1) == 3  # spans 40, 60, 50, 70 after step 0: median_low 50
    assert timeline.pick_step(steps, warmup=9) == 2  # no step after warm-up: median of all
    flight, hidden = timeline.overlap(steps[0][3])
    assert flight == pytest.approx(20e3) and hidden == pytest.approx(15e3)


def test_timeline_figure_draws_one_lane_per_rank_and_the_overlap():
    fig, k = timeline.draw(_trace([40, 50, 60]), warmup=0)
    (ax,) = fig.axes
    assert k == 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert len(ax.collections) == 2 * 5  # every event of the step on both ranks, one bar each
    widths = sorted(round(c.get_paths()[0].get_extents().width, 6) for c in ax.collections)
    assert widths == [5, 5, 10, 10, 10, 10, 10, 10, 20, 20]  # ms
    assert "75% of all-reduce time under backward" in ax.get_title()
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {
        "forward",
        "backward",
        "bucket all-reduce",
        "optimizer",
    }


# -- all-reduce sizes -------------------------------------------------------------------------
def _allreduce_result(ranks=2):
    rows = []
    for impl, scale in (("raw", 1.0), ("seam", 1.5)):
        for n in (1024, 1 << 20):
            t = scale * (5e-6 + n / 1e9)
            rows.append({"bytes": n, "impl": impl, "ranks": ranks, "avg_s": t})
    return {"benchmark": "allreduce", "ranks": ranks, "rows": rows}


def _shm_result(ranks=2):
    rows = [{"bytes": n, "ranks": ranks, "shared": n / 4e9, "raw": n / 2e9, "memcpy": n / 8e9} for n in (4096, 1 << 22)]
    return {"benchmark": "shm", "ranks": ranks, "rows": rows}


def test_bus_bandwidth_is_nccl_tests_busbw():
    from mpi_sgd.bench.allreduce import bus_factor

    for p in (1, 2, 3, 8):
        assert allreduce.bus_bandwidth(1 << 20, p, 1e-3) == pytest.approx((1 << 20) / 1e-3 * bus_factor(p) / 1e9)


def test_allreduce_figure_has_time_and_bandwidth_per_implementation():
    fig = allreduce.draw(_allreduce_result(), _shm_result(ranks=3))
    (at, ab), (st, sb) = np.reshape(fig.axes, (2, 2))
    assert [line.get_label() for line in at.get_lines()] == ["raw", "seam"]
    assert list(at.get_lines()[1].get_ydata()) == pytest.approx([1.5e6 * (5e-6 + n / 1e9) for n in (1024, 1 << 20)])
    memcpy = st.get_lines()[-1]
    assert memcpy.get_label().startswith("memcpy") and memcpy.get_linestyle() == "--"
    shared = sb.get_lines()[0]
    assert list(shared.get_ydata()) == pytest.approx([4 / 3 * 4.0] * 2)  # 2(p-1)/p at p = 3, of 4 GB/s
    assert "3 ranks" in st.get_title() and "fresh buffer" in st.get_title()
    assert ab.get_ylabel() == "bus bandwidth (GB/s)"


def test_shm_series_are_the_implementations_times_not_their_blocks_or_counts():
    result = _shm_result(ranks=2)
    for r in result["rows"]:
        r |= {"shared_blocks": [r["shared"]] * 3, "shared_busbw_GBps": 1.5, "shared_wrong": 0, "raw_wrong": 0}
    series = allreduce.shm_series(result)
    assert list(series) == ["shared", "raw", "memcpy"]
    assert series["shared"] == ([4096, 1 << 22], [4096 / 4e9, (1 << 22) / 4e9])
    allreduce.draw(None, result)  # bench shm's own JSON draws (its block lists broke it before)


def test_allreduce_figure_at_one_rank_has_no_bandwidth_lines():
    fig = allreduce.draw(_allreduce_result(ranks=1), None)
    assert len(fig.axes) == 2 and not fig.axes[1].get_lines()
    with pytest.raises(ValueError, match="nothing to draw"):
        allreduce.draw(None, None)


# -- ZeRO memory ---------------------------------------------------------------------------------
def _zero_result(psi=1 << 20, R=4):
    mem = {}
    for variant, stage in zero.VARIANTS.items():
        want = memmodel.model_states(psi, stage, R, "adam")
        at = {"params": want.params, "grads": want.grads * (2 if stage == 1 else 1), "optimizer": want.optimizer}
        mem[variant] = [at, {k: 1.25 * v for k, v in at.items()}]
    return {"world_size": R, "psi": psi, "memory": mem}


def test_zero_bars_set_measured_beside_the_formula():
    rows = zero.bars(_zero_result(), "adam")
    assert [r[0] for r in rows] == ["dp", "zero1", "zero2", "zero3"]
    dp, z1, _, z3 = rows
    assert dp[3] == {"params": 4.0, "grads": 4.0, "optimizer": 8.0}  # MiB for 1 Mi parameters, fp32 Adam
    assert z3[3] == {"params": 1.0, "grads": 1.0, "optimizer": 2.0}  # everything / R
    assert z1[2]["grads"] == 8.0 and z1[3]["grads"] == 4.0  # a measurement that differs is shown as it is
    assert dp[4] == pytest.approx(1.25 * 16)


def test_zero_figure_stacks_three_states_twice_per_stage():
    fig = zero.draw(_zero_result(), "adam")
    (ax,) = fig.axes
    assert len(ax.patches) == 4 * 2 * 3
    assert [round(p.get_height(), 6) for p in ax.patches[:6]] == [4.0, 4.0, 8.0, 4.0, 4.0, 8.0]
    assert [p.get_hatch() for p in ax.patches[:6]] == [None] * 3 + ["//"] * 3
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"parameters", "gradients", "optimizer state", "formula (hatched)", "peak during the step"} <= set(labels)
    assert "R = 4" in ax.get_title()
    with pytest.raises(ValueError, match="no stage"):
        zero.bars({"world_size": 2, "psi": 10, "memory": {"local": None}}, "adam")


# -- pipeline schedules --------------------------------------------------------------------------
def _pipe_trace(ops: list[tuple[str, int, int, float, float]]) -> dict:
    """(kind, micro-batch, stage, start ms, ms) -> a bench pipeline trace."""
    return {
        "traceEvents": [
            {"name": f"{k}{mb}", "tid": s, "ts": 1e3 * a, "dur": 1e3 * d, "args": {"micro_batch": mb, "stage": s}}
            for k, mb, s, a, d in ops
        ]
    }


def test_pipeline_bubble_of_a_trace_is_idle_stage_time():
    # R = 2, m = 1, unit ops in sequence: each stage idle half the span, (R-1)/(m+R-1) = 1/2.
    trace = _pipe_trace([("F", 0, 0, 0, 1), ("F", 0, 1, 1, 1), ("B", 0, 1, 2, 1), ("B", 0, 0, 3, 1)])
    assert pipeline.trace_bubble(trace) == (pytest.approx(0.5), 2, 1)


def test_pipeline_figure_has_lanes_a_replay_and_the_formula():
    ops = [(k, i, s, 2 * i + s + (10 if k == "B" else 0), 1) for k in "FB" for i in range(2) for s in range(2)]
    gpipe = _pipe_trace(ops)
    rows = [
        {"schedule": s, "m": m, "bubble": b, "replayed_bubble": b - 0.05, "per_op_s": [[1e-3, 2e-3]] * 2}
        for s in ("gpipe", "1f1b")
        for m, b in ((1, 0.6), (2, 0.45), (4, 0.3))
    ]
    fig = pipeline.draw({"world_size": 2, "rows": rows}, {"gpipe": gpipe, "1f1b": gpipe})
    ran, replayed, ran2, _, bubbles = fig.axes
    assert [t.get_text() for t in ran.get_yticklabels()] == ["stage 0", "stage 1"]
    assert len(ran.collections) == 8 and sorted(t.get_text() for t in ran.texts)[:2] == ["B0", "B0"]
    assert ran.get_title().startswith("GPipe, R = 2, m = 2, as it ran") and ran2.get_title().startswith("1F1B")
    # equal stages and free messages: the replay's bubble is the formula's, (2-1)/(2+2-1)
    assert "replayed" in replayed.get_title() and "bubble 0.33 (formula 0.33)" in replayed.get_title()
    assert len(replayed.collections) == 8
    formula, measured = bubbles.get_lines()[:2]
    assert formula.get_label() == "(R-1)/(m+R-1)"
    assert list(formula.get_ydata()) == pytest.approx([ideal_bubble(2, m) for m in formula.get_xdata()])
    assert list(measured.get_xdata()) == [1, 2, 4] and list(measured.get_ydata()) == [0.6, 0.45, 0.3]


def test_pipeline_replay_is_the_ideal_machine():
    boxes = pipeline.replayed_boxes("1f1b", [[1e-3, 2e-3]] * 3, 4)
    assert len(boxes) == 3 * 2 * 4
    assert pipeline.boxes_bubble(boxes)[0] == pytest.approx(ideal_bubble(3, 4))


# -- staleness -----------------------------------------------------------------------------------
def test_staleness_histogram_sums_rounds_and_marks_the_mean():
    runs = [{"staleness": {"0": 1, "2": 3}}, {"staleness": {"2": 2, "3": 4}}]
    job = {"scenario": "base", "ranks": 4, "straggler_ms": 0, "runs": {"async": runs}}
    assert staleness.counts(job) == {0: 1, 2: 5, 3: 4}
    fig = staleness.draw({"jobs": [job, {**job, "scenario": "straggler", "straggler_ms": 50}]})
    ax, bx = fig.axes
    assert [p.get_height() for p in ax.patches] == pytest.approx([10, 0, 50, 40])  # % of 10 gradients
    mean, turns = ax.get_lines()
    assert mean.get_xdata()[0] == pytest.approx(2.2) and turns.get_xdata()[0] == 2  # W - 1, 3 workers
    assert "3 workers" in ax.get_title() and "50 ms slower" in bx.get_title()


# -- speedup ---------------------------------------------------------------------------------------
def _validate_result():
    net = {"alpha": 1e-5, "beta": 1e-9, "gamma": 0.0, "name": "test"}
    rows, repeats = [], []
    for b, t_comp, meas in ((1, 2e-3, {2: 0.3, 4: 0.2}), (512, 0.2, {2: 1.6, 4: 2.5})):
        repeats += [{"batch": b, "ranks": r, "t_comp": t_comp * (1 + 0.1 * (r - 1))} for r in (1, 2, 4)]
        for r in (1, 2, 4):
            m = meas.get(r, 1.0)
            rows.append(
                {
                    "batch": b,
                    "ranks": r,
                    "pred_speedup": m * 1.1,
                    "meas_speedup": m,
                    "spread": {"meas_speedup": [m * 0.9, m, m * 1.2]},
                }
            )
    runs = {f"B={b}": [{"network": net, "grad_bytes": 8_000_000}] for b in (1, 512)}
    verdicts = ["met: |error| <= 10% at R = 1, 2", "MISSED: speedup < 1 exactly where predicted"]
    return {"rows": rows, "repeats": [repeats], "runs": runs, "transport": "tcp", "verdicts": verdicts}


def test_speedup_model_curve_is_the_perfmodel():
    result = _validate_result()
    curve = speedup.model_curve(result, 512, ranks=[1, 2, 8])
    sync = pm.AllreduceSync(pm.Network(1e-5, 1e-9, 0.0), 8_000_000)
    want = [2 * 0.2 / (0.2 + sync(2)), 8 * 0.2 / (0.2 + sync(8))]
    assert [p.speedup for p in curve] == pytest.approx([1.0, *want])


def test_speedup_figure_has_model_predictions_and_measurements():
    fig = speedup.draw(_validate_result())
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    for b in (1, 512):
        assert {f"B={b}: model, separate nodes", f"B={b}: model, T_comp(R) calibrated here", f"B={b}: measured"} <= set(
            labels
        )
    assert {"ideal, T_sync = 0", "break-even"} <= set(labels)
    model = next(line for line in ax.get_lines() if line.get_label() == "B=512: model, separate nodes")
    assert list(model.get_xdata()) == list(range(1, speedup.MAX_RANKS + 1))
    measured = [c for c in ax.containers if c.get_label() == "B=512: measured"][0]
    assert list(measured.lines[0].get_ydata()) == [1.0, 1.6, 2.5]
    assert "MISSED: speedup < 1 exactly where predicted" in fig.texts[-1].get_text()  # its verdict, as printed


# -- provenance ----------------------------------------------------------------------------------
def test_every_figure_says_where_it_came_from(tmp_path):
    prov = Provenance("zero-memory", "mpi-sgd figures zero-memory", ["mpiexec -n 4 mpi-sgd bench zero"])
    prov.machine = {"cpu": "Test CPU", "cores": 2}
    prov.load_before, prov.load_after = 7.5, 9.0
    fig = zero.draw(_zero_result(), "adam")
    path = save(fig, tmp_path / "zero-memory.png", prov)
    footer = fig.texts[-1].get_text()
    assert "mpi-sgd figures zero-memory" in footer and "Test CPU, 2 cores" in footer and "under load" in footer
    side = json.loads(path.with_suffix(".json").read_text())
    assert side["command"] == "mpi-sgd figures zero-memory" and side["jobs"] == ["mpiexec -n 4 mpi-sgd bench zero"]
    assert side["machine"]["cpu"] == "Test CPU" and side["date"] == prov.date
    assert side["load"] == "load 7.5 before, 9.0 after, on 2 cores: measured under load"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prov.load_before = 0.4
    assert not prov.under_load and "under load" not in prov.footer()
    assert Provenance.from_record(side).jobs == side["jobs"]


def test_svg_figures_are_the_same_file_when_drawn_again(tmp_path):
    prov = Provenance("ring-allreduce", "mpi-sgd figures ring-allreduce")
    a = save(ring.draw(textbook_ring(3)), tmp_path / "a.svg", prov).read_bytes()
    b = save(ring.draw(textbook_ring(3)), tmp_path / "b.svg", prov).read_bytes()
    assert a == b and b"<svg" in a and "Σ".encode() in a  # text kept as text


def test_time_to_target_figure_draws_a_run_where_every_batch_missed(tmp_path):
    # bench goodput saves its figure after printing "no fit": with no steps to plot, log axes have
    # nothing to scale (matplotlib raised), and the run ended in a traceback after its tables.
    from mpi_sgd.figures import goodput

    rows = [{"batch": b, "steps": None, "rule_steps": None} for b in (8, 16)]
    fig = goodput.draw({"rows": rows, "rule": "sqrt", "fit": None, "jobs": []})
    fig.savefig(tmp_path / "t.png")
    assert fig.axes[0].get_xscale() == "linear"
