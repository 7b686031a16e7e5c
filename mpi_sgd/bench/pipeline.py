"""Pipeline step time, bubble and activation memory: GPipe and 1F1B against the unsplit model.

One run times, interleaved (see :mod:`.timing`), a full training step (all micro-batches forward
and backward through the R stages, then every stage's optimizer step) of an MLP of ``--depth``
layers of ``--width`` units plus a 10-way head, at batch ``--batch-size``, for each schedule and
each m in ``--micro-batches``, next to:

* ``unsplit``: the whole model trained at the same batch in one process, every rank at once
  (so the ranks still share the host's cores as they do in the pipeline). A pipeline of R equal
  stages at best takes ``unsplit / R`` of compute per step; with the bubble it takes
  ``unsplit * (m + R - 1) / (m * R)``, the ``ideal`` column.

The default model (12 x 256 + head, batch 512) is sized so compute dominates: an activation
message at m = 8 is 64 rows x 256 floats (64 KiB, tens of microseconds over shared memory)
against milliseconds of F or B; 256-wide weights stay in cache; and 64 rows per micro-batch keep
the fixed cost of each op (the layer calls, autograd's bookkeeping, accumulating into ``.grad``)
small next to its arithmetic.

``F+B ms`` is the compute of one stage per step (the mean over stages of the seconds in its F and
B ops): it grows with m where small micro-batches make the matrix products less efficient.
``bubble`` is measured: ``1 - (seconds the stages spent in F and B ops) / (R * step span)``,
summed over the timed steps; anything that is not computing counts as bubble, messages and
imbalance between stages included. ``replayed`` runs the schedule on the idealised machine of
:func:`mpi_sgd.pipeline.simulate` with each stage's own F and B times as measured (the median
step, per op): the bubble these stages would have with free messages and a core each, so the
gap to ``bubble`` is messages and the host. ``(R-1)/(m+R-1)`` is GPipe's formula for equal
stages and free messages. On a host with fewer cores than ranks, the ranks also take turns on
the cores: a stage whose input is ready may wait for a core (counted as bubble) and an op that is
preempted counts the wait as compute, so figures at R > cores measure the host as much as the
schedule.

Memory: one more step per (schedule, m) with an activation meter on every stage
(:class:`mpi_sgd.pipeline.ActivationMeter`): the peak bytes autograd held for backward, and the
most micro-batches held at once. Timeline: one traced step per schedule at ``--timeline-m``,
written as a Chrome trace (``pipeline-timeline-<schedule>-n<R>.json``, open in ui.perfetto.dev).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from ..args import UsageError, add_command, choices_list, flag, nonneg_int, positive_int, positive_ints
from ..config import TrainConfig
from ..gradsync import LocalGradients
from ..models import MLP
from ..pipeline import SCHEDULES, SPLITS, PipelineStage, cut, ideal_bubble, peak_in_flight, simulate
from ..pipeline.schedule import bubble
from ..report import Output, markdown_table, new_figure, save_results, write_json
from ..step import make_optimizer, train_step
from ..timing import time_interleaved

OPTIMIZER = TrainConfig(optimizer="sgd", lr=1e-3, momentum=0.9)  # the pipeline's and the unsplit model's


@dataclass(frozen=True)
class Flags(Output):
    width: int = flag(256, "units per hidden layer", positive_int)
    depth: int = flag(12, "hidden layers of --width units", positive_int)
    batch_size: int = flag(512, "samples per step", positive_int)
    micro_batches: list = flag([1, 2, 4, 8], "comma-separated micro-batch counts m", positive_ints)
    schedules: list = flag(list(SCHEDULES), "comma-separated schedules", choices_list(SCHEDULES, "schedule"))
    split: str = flag("params", "how to cut the layers", choices=SPLITS)
    steps: int = flag(4, "timed steps per block", positive_int)
    rounds: int = flag(3, "interleaved blocks per variant", positive_int)
    warmup: int = flag(2, "discarded steps per variant", nonneg_int)
    timeline_m: int = flag(4, "micro-batches of the traced step", positive_int)
    seed: int = flag(0, "seed for the model and data")

    def __post_init__(self):
        if max(self.micro_batches + [self.timeline_m]) > self.batch_size:
            raise ValueError(f"--batch-size {self.batch_size} is smaller than the largest m")


def _model(args) -> MLP:
    torch.manual_seed(args.seed)
    return MLP((args.width,) * (args.depth + 1) + (10,))


def _data(args):
    g = torch.Generator().manual_seed(args.seed + 1)  # the same batch on every rank
    return torch.randn(args.batch_size, args.width, generator=g), torch.randint(10, (args.batch_size,), generator=g)


def _pipeline_step(comm, args, schedule: str, m: int, x, y, **kw):
    module, bounds = cut(_model(args), comm, args.split, sample=x[: max(1, len(x) // m)])
    stage = PipelineStage(comm, module, F.cross_entropy, schedule, m, **kw)
    opt = make_optimizer(OPTIMIZER, module)

    def step():
        stage.forward_backward(x, y)
        opt.step()

    return stage, step, bounds


def _unsplit_step(args, x, y):
    """The whole model's step in this process: the trainer's own step, with nothing averaged."""
    model = _model(args)
    opt = make_optimizer(OPTIMIZER, model)
    sync = LocalGradients(model)
    return lambda: train_step(model, opt, sync, x, y)


def measure(comm, args) -> dict:
    x, y = _data(args)
    calls, stages = {"unsplit": _unsplit_step(args, x, y)}, {}
    for schedule in args.schedules:
        for m in args.micro_batches:
            stages[(schedule, m)], calls[f"{schedule} m={m}"], bounds = _pipeline_step(comm, args, schedule, m, x, y)
    times = time_interleaved(comm, calls, iterations=args.steps * args.rounds, warmup=args.warmup, rounds=args.rounds)
    R, unsplit = comm.size, times["unsplit"].max
    rows = []
    for (schedule, m), stage in stages.items():
        timed = stage.stats[args.warmup :]
        busy, span = sum(s["busy"] for s in timed), sum(s["span"] for s in timed)
        everyone = comm.allgather_obj((busy, span))
        # Each stage's typical F and B (median over steps, so a preempted op does not set it),
        # replayed on the ideal machine: the bubble of this schedule with these stages' real costs.
        per_op = comm.allgather_obj([statistics.median(s[k] for s in timed) / m for k in ("forward", "backward")])
        replayed = bubble(simulate(schedule, R, m, [f for f, _ in per_op], [b for _, b in per_op]))
        step = times[f"{schedule} m={m}"].max
        rows.append(
            {
                "schedule": schedule,
                "m": m,
                "step_s": step,
                "step_s_min_rank": times[f"{schedule} m={m}"].min,
                "bubble": 1 - sum(b for b, _ in everyone) / sum(s for _, s in everyone),
                "compute_s": sum(b for b, _ in everyone) / (R * max(1, len(timed))),
                "replayed_bubble": replayed,
                "per_op_s": per_op,
                "ideal_bubble": ideal_bubble(R, m),
                "ideal_step_s": unsplit * (m + R - 1) / (m * R),
                "speedup": unsplit / step,
            }
        )
    return {"unsplit_s": unsplit, "bounds": bounds, "rows": rows}


def memory(comm, args) -> list[dict]:
    x, y = _data(args)
    rows = []
    for m in args.micro_batches:
        for schedule in args.schedules:
            stage, step, _ = _pipeline_step(comm, args, schedule, m, x, y, measure_memory=True)
            step()
            peaks = comm.allgather_obj((stage.meter.peak, peak_in_flight(stage.ops)))
            rows += [
                {"schedule": schedule, "m": m, "stage": s, "peak_bytes": p, "held": h} for s, (p, h) in enumerate(peaks)
            ]
    return rows


def timelines(comm, args) -> dict:
    x, y = _data(args)
    traces = {}
    for schedule in args.schedules:
        stage, step, _ = _pipeline_step(comm, args, schedule, args.timeline_m, x, y, timeline=True)
        for _ in range(max(1, args.warmup)):
            step()
        stage.start_timeline()  # trace one step after warm-up
        step()
        traces[schedule] = stage.timeline()
    return traces


def bubble_table(rows, unsplit: float) -> str:
    headers = ["schedule", "m", "step ms", "F+B ms", "ideal ms", "x unsplit", "bubble", "replayed", "(R-1)/(m+R-1)"]
    body = [
        [
            r["schedule"],
            r["m"],
            1e3 * r["step_s"],
            1e3 * r["compute_s"],
            1e3 * r["ideal_step_s"],
            r["speedup"],
            r["bubble"],
            r["replayed_bubble"],
            r["ideal_bubble"],
        ]
        for r in rows
    ]
    nan = float("nan")
    return markdown_table(headers, [["unsplit", "-", 1e3 * unsplit, nan, nan, 1.0, nan, nan, nan]] + body)


def memory_table(rows, schedules) -> str:
    by = {(r["schedule"], r["m"], r["stage"]): r for r in rows}
    keys = sorted({(r["m"], r["stage"]) for r in rows})
    headers = ["m", "stage"] + [f"{s} KiB" for s in schedules] + [f"{s} held" for s in schedules]
    body = []
    for m, s in keys:
        body.append(
            [m, s]
            + [by[(k, m, s)]["peak_bytes"] / 1024 for k in schedules]
            + [by[(k, m, s)]["held"] for k in schedules]
        )
    return markdown_table(headers, body)


def plot(rows, R: int, path) -> None:
    fig, ax = new_figure(figsize=(6, 4))
    ms = sorted({r["m"] for r in rows})
    ax.plot(ms, [ideal_bubble(R, m) for m in ms], "k--", label="(R-1)/(m+R-1)")
    for schedule in dict.fromkeys(r["schedule"] for r in rows):
        mine = sorted((r["m"], r["bubble"]) for r in rows if r["schedule"] == schedule)
        ax.plot([m for m, _ in mine], [b for _, b in mine], "o-", label=f"{schedule} measured")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction")
    ax.set_title(f"pipeline bubble, R = {R}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(comm, args) -> int:
    from ..launch import pin_threads

    threads = pin_threads(comm.local_size)
    timing = measure(comm, args)
    mem = memory(comm, args)
    traces = timelines(comm, args)
    if not comm.is_root:
        return 0
    R = comm.size
    print(
        f"pipeline, {R} stage(s) (layer bounds {timing['bounds']}, split by {args.split}), MLP {args.depth} x "
        f"{args.width} + 10-way head,\nbatch {args.batch_size}, {threads} torch thread(s) per rank, median of "
        f"{args.rounds} interleaved blocks of {args.steps} steps, slowest rank\n"
    )
    print(bubble_table(timing["rows"], timing["unsplit_s"]))
    print("\npeak activation memory per stage (bytes autograd held for backward) and micro-batches held at once\n")
    print(memory_table(mem, args.schedules))
    for schedule, trace in traces.items():
        path = write_json(Path(args.out_dir) / f"pipeline-timeline-{schedule}-n{R}.json", trace)
        print(f"timeline ({schedule}, m = {args.timeline_m}): {path}")
    payload = {
        "world_size": R,
        "threads": threads,
        "config": asdict(args),
        **timing,
        "memory": mem,
    }
    save_results(args, f"pipeline-n{R}", payload, lambda png: plot(timing["rows"], R, png))
    return 0


def add_parser(kinds) -> None:
    """``mpi-sgd bench pipeline``: register on the ``bench`` command's sub-parsers."""
    add_command(
        kinds,
        "pipeline",
        Flags,
        _run,
        help="pipeline step time, bubble vs (R-1)/(m+R-1), activation memory, timeline: GPipe vs 1F1B",
        description=__doc__,
    )


def _run(args: Flags) -> int:
    from ..comm import init
    from ..launch import placement

    ranks = placement().size
    if args.depth + 1 < ranks:
        raise UsageError(f"{args.depth + 1} layers cannot be cut into {ranks} stages: raise --depth or run fewer ranks")
    return main(init("mpi4py"), args)
