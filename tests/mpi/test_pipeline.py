"""A pipeline over R ranks trains exactly what the unsplit model trains in one process.

Run as ``mpiexec -n R python -m mpi4py -m pytest --with-mpi tests/mpi`` (R = 1, 2, 3 in ``make
test``; R = 4 from tests/integration). Every rank builds the whole model from one seed, keeps its
stage, and also trains the unsplit reference itself on the same batches with plain torch; it
then compares its own stage with the matching layers of the reference.

Tolerance, in float64. With m = 1 the pipeline runs the very operations of the unsplit model
(the same matrix products on the same rows, the gradient handed across a stage boundary instead
of inside one autograd graph), so the results must be bit-identical, and are checked so. With
m > 1 the batch's weight gradient is summed as m partial matrix products instead of one, and the
loss as m scaled means instead of one mean: the same numbers added in another order. Each entry
then differs by a few ulps (measured: at most 4.4e-16 after K = 3 steps), and SGD with momentum at
these learning rates carries that forward without growing it. We allow 1e-12 absolute (the values
are O(1)): three orders of margin above what reordering gives, and nine below what a real mistake
gives (a micro-batch dropped or used twice, a missing len/B scaling, the gradient of the wrong
micro-batch), which moves parameters by O(lr * |g|) ~ 1e-2 after one step.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch.nn import functional as F

from mpi_sgd.gradsync import NaiveAllReduce
from mpi_sgd.models import MLP
from mpi_sgd.pipeline import PipelineError, PipelineStage, cut, grid, layers_of, peak_in_flight
from mpi_sgd.pipeline import schedule as schedule_of
from mpi_sgd.pipeline.stage import ACT_TAG

pytestmark = pytest.mark.mpi

ATOL = 1e-12
STEPS = 3
B = 10  # with m = 4 the micro-batches are 3, 3, 2, 2 rows: uneven on purpose
SIZES = (12, 16, 16, 16, 16, 16, 5)  # six layers: enough for four stages


def batches(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(B, SIZES[0], generator=g, dtype=torch.float64), torch.randint(SIZES[-1], (B,), generator=g))
        for _ in range(STEPS)
    ]


def train_both(comm, schedule: str, m: int, split: str = "layers", optimizer=torch.optim.SGD):
    """K steps of the pipeline and of the reference; per step the worst |difference| of loss and grads."""
    torch.manual_seed(7)
    model = MLP(SIZES).double()
    ref = copy.deepcopy(model)
    module, bounds = cut(model, comm, by=split, sample=torch.randn(4, SIZES[0], dtype=torch.float64))
    ref_module = torch.nn.Sequential(*layers_of(ref)[bounds[comm.rank] : bounds[comm.rank + 1]])
    stage = PipelineStage(comm, module, F.cross_entropy, schedule, m)
    kw = dict(lr=0.05, momentum=0.9) if optimizer is torch.optim.SGD else dict(lr=0.01)
    opt, ref_opt = optimizer(module.parameters(), **kw), optimizer(ref.parameters(), **kw)
    diffs = []
    for x, y in batches():
        loss = stage.forward_backward(x if stage.first else None, y if stage.last else None)
        ref_opt.zero_grad()
        ref_loss = F.cross_entropy(ref(x), y)
        ref_loss.backward()
        worst = max(
            (a.grad - b.grad).abs().max().item()
            for a, b in zip(module.parameters(), ref_module.parameters(), strict=True)
        )
        if stage.last:
            worst = max(worst, abs(loss - ref_loss.item()))
        else:
            assert loss is None
        diffs.append(worst)
        opt.step()
        ref_opt.step()
    params = max((a - b).abs().max().item() for a, b in zip(module.parameters(), ref_module.parameters(), strict=True))
    return diffs, params, stage


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_equals_the_unsplit_model(world, schedule, m):
    grads, params, _ = train_both(world, schedule, m)
    everyone = world.allgather_obj((max(grads), params))  # every rank checks every stage
    for rank, (g, p) in enumerate(everyone):
        if m == 1:
            assert g == 0.0 and p == 0.0, f"stage {rank}: m = 1 must be bit-identical, got {g:.3g} / {p:.3g}"
        assert g <= ATOL and p <= ATOL, (
            f"stage {rank} of {world.size}, {schedule}, m={m}: grads {g:.3g}, params {p:.3g}"
        )


@pytest.mark.parametrize("split, optimizer", [("params", torch.optim.Adam), ("time", torch.optim.SGD)])
def test_other_splits_and_optimizers_are_equal_too(world, split, optimizer):
    grads, params, _ = train_both(world, "1f1b", 4, split, optimizer)
    assert all(g <= ATOL and p <= ATOL for g, p in world.allgather_obj((max(grads), params)))


def test_any_communicator_one_stage_per_rank(comm):
    """Over a duplicate, gloo, and COMM_SELF/LocalComm (world size 1 inside any job: the whole model)."""
    grads, params, stage = train_both(comm, "gpipe", 2)
    assert stage.stages == comm.size and max(grads) <= ATOL and params <= ATOL


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_pipelines_side_by_side_data_parallel_equal_the_unsplit_model(world, stages):
    """A grid of D = R / stages replicas, each a pipeline over its own B samples of a global batch of
    D * B, gradients averaged over each stage's copies: the unsplit model's step on all D * B. At R = 4
    and two stages it is a true 2 x 2 grid; the averaging adds one more reordered sum, same tolerance."""
    if world.size % stages:
        pytest.skip(f"{stages} stages do not divide {world.size} ranks")
    pipe, data = grid(world, stages)
    replicas, replica = world.size // stages, world.rank // stages
    torch.manual_seed(7)
    model = MLP(SIZES).double()
    ref = copy.deepcopy(model)
    module, bounds = cut(model, pipe)
    ref_module = torch.nn.Sequential(*layers_of(ref)[bounds[pipe.rank] : bounds[pipe.rank + 1]])
    stage, sync = PipelineStage(pipe, module, F.cross_entropy, "1f1b", 4), NaiveAllReduce(module, data)
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        x = torch.randn(replicas * B, SIZES[0], generator=g, dtype=torch.float64)
        y = torch.randint(SIZES[-1], (replicas * B,), generator=g)
        mine = slice(replica * B, (replica + 1) * B)
        stage.forward_backward(x[mine], y[mine])
        sync.wait()
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    worst = max((a - b).abs().max().item() for a, b in zip(module.parameters(), ref_module.parameters(), strict=True))
    assert max(world.allgather_obj(worst)) <= ATOL


def test_grid_keeps_the_wrappers_of_the_communicator_it_splits(world):
    """Debug mode on the world stays on in each pipeline and each data-parallel group."""
    from mpi_sgd.comm.wrappers.checked import CheckedComm

    stages = world.size if world.size % 2 else max(1, world.size // 2)
    pipe, data = grid(CheckedComm(world), stages)
    assert isinstance(pipe, CheckedComm) and isinstance(data, CheckedComm)
    assert (pipe.size, data.size, pipe.rank, data.rank) == (
        stages,
        world.size // stages,
        *divmod(world.rank, stages)[::-1],
    )


def test_1f1b_holds_fewer_activations_than_gpipe(world):
    """Measured bytes, not the schedule's count: with equal micro-batches (B = 8, m = 4) every micro-batch
    leaves the same bytes on a stage, so GPipe's peak is m of them and 1F1B's min(R - s, m)."""
    m, peaks = 4, {}
    for schedule in ("gpipe", "1f1b"):
        torch.manual_seed(7)
        module, _ = cut(MLP(SIZES).double(), world)
        stage = PipelineStage(world, module, F.cross_entropy, schedule, m, measure_memory=True)
        x, y = batches()[0]
        stage.forward_backward(x[:8], y[:8])
        assert stage.meter.now == 0  # every micro-batch's activations were freed by its backward
        peaks[schedule] = stage.meter.peak
        held = peak_in_flight(stage.ops)
    per_micro_batch = peaks["gpipe"] / m
    assert per_micro_batch > 0 and held == min(world.size - world.rank, m)
    assert peaks["1f1b"] == held * per_micro_batch


def test_timeline_has_one_box_per_op_in_schedule_order(world):
    torch.manual_seed(7)
    module, _ = cut(MLP(SIZES).double(), world)
    stage = PipelineStage(world, module, F.cross_entropy, "1f1b", 4, timeline=True)
    x, y = batches()[0]
    stage.forward_backward(x, y)
    trace = stage.timeline()
    if not world.is_root:
        assert trace is None
        return
    events = trace["traceEvents"]
    assert trace["displayTimeUnit"] == "ms" and {e["ph"] for e in events} == {"X"}
    for rank in range(world.size):
        lane = [e for e in events if e["tid"] == rank]
        assert sorted(e["name"] for e in lane) == sorted(f"{k}{i}" for k in "FB" for i in range(4))
        assert all(e["args"] == {"micro_batch": int(e["name"][1:]), "stage": rank} for e in lane)
        assert all(e["dur"] >= 0 and e["ts"] >= -1e3 for e in lane)  # µs; a barrier's skew at most
        assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in itertools.pairwise(lane))  # one op at a time
        assert [e["name"] for e in lane] == [str(op) for op in schedule_of("1f1b", rank, world.size, 4)]


@pytest.mark.mpi(min_size=2)
def test_a_message_for_the_wrong_micro_batch_is_an_error_not_garbage(world):
    torch.manual_seed(7)
    module, _ = cut(MLP(SIZES).double(), world)
    stage = PipelineStage(world, module, F.cross_entropy, "gpipe", 4)
    if world.rank == 0:
        stage._send(torch.ones(3, 16, dtype=torch.float64), 1, ACT_TAG, mb=2)
        for r in stage._pending:
            r.wait()
    elif world.rank == 1:
        with pytest.raises(
            PipelineError,
            match=r"stage 1 \(gpipe\) got an activation from rank 0 .*\(0, 2, 4\), "
            r"expected \(0, 0, 4\)",
        ):
            stage._recv(0, ACT_TAG, mb=0)
    world.barrier()


def test_bench_pipeline_tables_json_and_timelines(world, capsys):
    """``mpi-sgd bench pipeline`` in-process at a tiny size: its tables, JSON and Chrome traces."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from mpi_sgd.bench import pipeline as bench
    from mpi_sgd.cli import build_parser

    out = world.bcast_obj(tempfile.mkdtemp() if world.is_root else None)
    namespace = build_parser().parse_args(
        [
            "bench",
            "pipeline",
            "--width",
            "8",
            "--depth",
            "3",
            "--batch-size",
            "8",
            "--micro-batches",
            "1,4",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--warmup",
            "1",
            "--timeline-m",
            "2",
            "--out-dir",
            out,
            "--no-plot",
        ]
    )
    assert bench.main(world, namespace.parser.build(bench.Flags, namespace)) == 0
    world.barrier()
    if world.is_root:
        text = capsys.readouterr().out
        header = next(line for line in text.splitlines() if line.startswith("|"))
        assert [c.strip() for c in header.strip("|").split("|")] == [
            "schedule",
            "m",
            "step ms",
            "F+B ms",
            "ideal ms",
            "x unsplit",
            "bubble",
            "replayed",
            "(R-1)/(m+R-1)",
        ]
        data = json.loads((Path(out) / f"pipeline-n{world.size}.json").read_text())
        assert [(r["schedule"], r["m"]) for r in data["rows"]] == [("gpipe", 1), ("gpipe", 4), ("1f1b", 1), ("1f1b", 4)]
        assert all(
            0 <= r["bubble"] < 1
            and 0 <= r["replayed_bubble"] < 1
            and r["ideal_bubble"] == (world.size - 1) / (r["m"] + world.size - 1)
            for r in data["rows"]
        )
        held = {(r["schedule"], r["m"], r["stage"]): r["held"] for r in data["memory"]}
        assert held[("gpipe", 4, 0)] == 4 and held[("1f1b", 4, 0)] == min(world.size, 4)
        for schedule in ("gpipe", "1f1b"):
            events = json.loads((Path(out) / f"pipeline-timeline-{schedule}-n{world.size}.json").read_text())
            events = events["traceEvents"]
            assert {e["ph"] for e in events} == {"X"} and {e["tid"] for e in events} == set(range(world.size))
            for rank in range(world.size):  # one traced step: F and B of each micro-batch, in schedule order
                lane = sorted((e for e in events if e["tid"] == rank), key=lambda e: e["ts"])
                assert [e["name"] for e in lane] == [str(op) for op in schedule_of(schedule, rank, world.size, 2)]
        shutil.rmtree(out)
    world.barrier()


@pytest.mark.mpi(min_size=3)
def test_bench_pipeline_refuses_more_stages_than_layers_in_one_line(world, capsys):
    """Two layers (--depth 1 and the head) cannot make three or more stages: exit 2 before any message."""
    from mpi_sgd.args import run_command
    from mpi_sgd.cli import build_parser

    with pytest.raises(SystemExit) as e:
        run_command(build_parser().parse_args(["bench", "pipeline", "--depth", "1"]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    expected = (
        f"mpi-sgd bench pipeline: error: 2 layers cannot be cut into {world.size} stages: "
        "raise --depth or run fewer ranks\n"
    )
    assert err == (expected if world.is_root else "")
