"""Sharded data parallel, measured: memory, communication and step time of ZeRO stages 1-3.

One run, at whatever R it is launched with, builds the same float32 model for each variant:

* ``local``  the step with no communication at all (every rank at once): the floor;
* ``dp``     plain data parallel, bucketed all-reduce (:mod:`mpi_sgd.gradsync`);
* ``zero1``, ``zero2``, ``zero3``  the stages of :mod:`mpi_sgd.zero`.

and prints three tables:

1. **Memory**: bytes of parameters, gradients and optimizer state one rank holds at the optimizer
   step, measured on the tensors (:mod:`mpi_sgd.zero.memory`), and the peak during the step,
   beside Rajbhandari et al.'s formulas in fp32 terms (:mod:`mpi_sgd.perfmodel.memory`: 4 B parameters,
   4 B gradients, 8 B Adam state or 4 B momentum per parameter). The slowest of the ranks'
   figures is shown (ranks differ only by padding).
2. **Communication**: bytes handed to each kind of collective in one step, counted by a
   :class:`~mpi_sgd.comm.wrappers.counting.CountingComm` around the communicator, their volume in units
   of Ψ (the parameter count times 4 B) beside the paper's 2Ψ and 3Ψ, and the bytes a rank sends
   with bandwidth-optimal collectives, (R-1)/R of the volume.
3. **Step time**, variants interleaved (:mod:`.timing`), slowest rank, with the ratio to plain
   data parallel and to ``local``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from .. import gradsync, zero
from ..args import add_command, choices_list, flag, integer, layer_widths, nonneg_int, positive_float, positive_int
from ..comm.wrappers.counting import CountingComm
from ..config import TrainConfig
from ..models import MLP
from ..perfmodel import memory as memmodel
from ..replicas import replicate
from ..report import Output, markdown_table, new_figure, save_results
from ..step import make_optimizer, train_step
from ..timing import time_interleaved

VARIANTS = ("local", "dp", "zero1", "zero2", "zero3")
# 13.6 M parameters in 13 layers of 1 M: plain data parallel's states with Adam take 218 MB per
# rank (870 MB over 4 ranks), and no one layer's transient buffers dominate the sharded peaks.
LAYERS = (1024,) * 14
MIB = 2**20


@dataclass(frozen=True)
class Flags(Output):
    layers: list = flag(list(LAYERS), "MLP widths", layer_widths)
    optimizer: str = flag("adam", "adam, or sgd with momentum", choices=("adam", "sgd"))
    batch_size: int = flag(16, "samples per rank per step", positive_int)
    variants: list = flag(list(VARIANTS), "comma-separated variants", choices_list(VARIANTS, "variant"))
    bucket_mb: float = flag(25.0, "bucket size of 'dp' in MB", positive_float)
    steps: int = flag(2, "timed steps per block", positive_int)
    rounds: int = flag(3, "interleaved blocks per variant", positive_int)
    warmup: int = flag(1, "discarded steps per variant", nonneg_int)
    seed: int = flag(0, "seed for models and data", integer)


def _stage(variant: str) -> int:
    return int(variant[-1]) if variant.startswith("zero") else 0


def _build(variant: str, comm, args):
    """(model, sync, optimizer) of one variant, the same initial model for all."""
    model = replicate(lambda: MLP(tuple(args.layers)), comm, args.seed)
    settings = TrainConfig(optimizer=args.optimizer, lr=1e-4 if args.optimizer == "adam" else 1e-3, momentum=0.9)
    if variant == "local":
        return model, gradsync.LocalGradients(model), make_optimizer(settings, model)
    if variant == "dp":
        return model, gradsync.make("bucketed", model, comm, args.bucket_mb), make_optimizer(settings, model)
    sync, optimizer = zero.make(_stage(variant), model, comm, lambda shards: make_optimizer(settings, shards))
    return model, sync, optimizer


def _step_fn(model, sync, optimizer, x, y, tracker=None, record=None):
    """The trainer's step (:func:`~mpi_sgd.step.train_step`) as a call, with the tracker sampled once
    the gradients are averaged and again after the update.

    ``record`` gets (seconds blocked in communication, seconds of the optimizer's update) per
    step; the update leaves out the parameter all-gather that stages 1-2 do inside ``step()``.
    """
    mark = {}

    def hook(phase: str) -> None:
        if tracker is not None:
            tracker.sample()
        if phase == "averaged":
            mark["t"], mark["blocked"] = time.perf_counter(), sync.seconds
        elif record is not None:
            record.append((sync.seconds, time.perf_counter() - mark["t"] - (sync.seconds - mark["blocked"])))

    return lambda: train_step(model, optimizer, sync, x, y, hook=hook)


def measure(comm, args) -> dict:
    g = torch.Generator().manual_seed(args.seed + comm.rank)  # each rank its own batch
    x = torch.randn(args.batch_size, args.layers[0], generator=g)
    y = torch.randint(args.layers[-1], (args.batch_size,), generator=g)
    counting = CountingComm(comm)
    built = {v: _build(v, counting, args) for v in args.variants}
    psi = sum(p.numel() for p in built[args.variants[0]][0].parameters())
    memory, traffic = {}, {}
    for v, (model, sync, optimizer) in built.items():
        tracker = zero.track_memory(sync if _stage(v) else None, model, optimizer)
        for _ in range(2):  # the first step creates the optimizer state; measure the second
            tracker.reset()
            counting.reset()
            _step_fn(model, sync, optimizer, x, y, tracker)()
        memory[v] = (tracker.last, tracker.peak)
        traffic[v] = (dict(counting.bytes), counting.volume(), counting.ring_bytes_sent())
        if _stage(v):
            sync.memory = None  # not sampled while timed
    records = {v: [] for v in built}
    calls = {v: _step_fn(m, sync, opt, x, y, record=records[v]) for v, (m, sync, opt) in built.items()}
    times = time_interleaved(comm, calls, iterations=args.steps * args.rounds, warmup=args.warmup, rounds=args.rounds)
    # per variant, the slowest rank's mean seconds blocked in communication and in the optimizer step
    parts = comm.allgather_obj(
        {v: [statistics.fmean(c) for c in zip(*r[args.warmup :] or r, strict=True)] for v, r in records.items()}
    )
    split = {v: [max(p[v][i] for p in parts) for i in (0, 1)] for v in built}
    # Ranks hold the same amounts up to padding: report the largest.
    everyone = comm.allgather_obj({v: (asdict(m[0]), asdict(m[1])) for v, m in memory.items()})
    worst = {v: max((r[v] for r in everyone), key=lambda m: sum(m[0].values())) for v in memory}
    times = {v: {**asdict(t), "comm": split[v][0], "optimizer": split[v][1]} for v, t in times.items()}
    return {"psi": psi, "memory": worst, "traffic": traffic, "times": times}


def _pair(measured: float, formula: float) -> str:
    return f"{measured / MIB:.1f} / {formula / MIB:.1f}"


def tables(result: dict, R: int, optimizer: str) -> str:
    psi, opt = result["psi"], "adam" if optimizer == "adam" else "momentum"
    mem_rows, comm_rows, time_rows = [], [], []
    dp_time = result["times"].get("dp", {}).get("max", float("nan"))
    local_time = result["times"].get("local", {}).get("max", float("nan"))
    for v, (at_step, peak) in result["memory"].items():
        stage = _stage(v)
        total = sum(at_step.values())
        want = memmodel.model_states(psi, stage, R, opt, "fp32")
        mem_rows.append(
            [
                v,
                _pair(at_step["params"], want.params),
                _pair(at_step["grads"], want.grads),
                _pair(at_step["optimizer"], want.optimizer),
                _pair(total, want.total),
                f"{total / want.total:.3f}",
                sum(peak.values()) / MIB,
            ]
        )
        by_op, volume, sent = result["traffic"][v]
        if v != "local":
            ring = memmodel.ring_bytes_sent(psi, stage, R)
            comm_rows.append(
                [
                    v,
                    by_op.get("allreduce", 0) / MIB,
                    by_op.get("reduce_scatter", 0) / MIB,
                    by_op.get("allgather", 0) / MIB,
                    f"{volume / (4 * psi):.3f} Ψ",
                    f"{memmodel.COMM_VOLUME[stage]} Ψ",
                    _pair(sent, ring),
                ]
            )
        t = result["times"][v]
        time_rows.append(
            [v, 1e3 * t["max"], 1e3 * t["comm"], 1e3 * t["optimizer"], t["max"] / dp_time, t["max"] / local_time]
        )
    k = "8" if opt == "adam" else "4"
    return "\n\n".join(
        [
            f"model-state memory per rank, MiB, measured at the optimizer step / Rajbhandari et al.'s formula\n"
            f"(fp32: 4 B parameters, 4 B gradients, {k} B {optimizer} state per parameter):",
            markdown_table(
                ["variant", "params", "grads", "optimizer state", "total", "measured/formula", "peak in step"], mem_rows
            ),
            f"communication per step per rank, MiB handed to each collective (Ψ = {psi:,} parameters x 4 B):",
            markdown_table(
                [
                    "variant",
                    "all-reduce",
                    "reduce-scatter",
                    "all-gather",
                    "volume",
                    "paper",
                    "sent by a ring / formula",
                ],
                comm_rows,
            ),
            "step time (slowest rank, median of interleaved blocks); of it, blocked in communication and\n"
            "in the optimizer's update (slowest rank's mean):",
            markdown_table(["variant", "step ms", "comm ms", "update ms", "x dp", "x local"], time_rows),
        ]
    )


def plot(result: dict, R: int, optimizer: str, path) -> None:
    """Model-state MiB per variant, stacked by kind; the formula and the peak as markers."""
    fig, ax = new_figure(figsize=(7, 4))
    names = list(result["memory"])
    bottom = [0.0] * len(names)
    for kind, color in (("params", "tab:blue"), ("grads", "tab:orange"), ("optimizer", "tab:green")):
        values = [result["memory"][v][0][kind] / MIB for v in names]
        ax.bar(names, values, bottom=bottom, color=color, label=kind)
        bottom = [b + x for b, x in zip(bottom, values, strict=True)]
    opt = "adam" if optimizer == "adam" else "momentum"
    formula = [memmodel.model_states(result["psi"], _stage(v), R, opt).total / MIB for v in names]
    ax.plot(names, formula, "k_", markersize=30, mew=2, label="formula")
    ax.plot(names, [sum(result["memory"][v][1].values()) / MIB for v in names], "rv", label="peak in step")
    ax.set_ylabel("MiB per rank")
    ax.set_title(f"model states per rank at R = {R}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(comm, args) -> int:
    from ..launch import pin_threads

    threads = pin_threads(comm.local_size)
    result = measure(comm, args)
    if comm.is_root:
        model = f"MLP {'-'.join(map(str, args.layers))} ({result['psi']:,} parameters, float32)"
        print(
            f"ZeRO at R = {comm.size}: {model}, {args.optimizer}, batch {args.batch_size} per rank, "
            f"{threads} torch thread(s) per rank\n"
        )
        print(tables(result, comm.size, args.optimizer))
        payload = {"world_size": comm.size, "layers": args.layers, **result}
        save_results(args, f"zero-n{comm.size}", payload, lambda png: plot(result, comm.size, args.optimizer, png))
    return 0


def add_parser(kinds) -> None:
    """``mpi-sgd bench zero``: register on the ``bench`` command's sub-parsers."""
    add_command(
        kinds,
        "zero",
        Flags,
        _run,
        help="ZeRO stages 1-3 vs plain data parallel: memory and bytes per rank vs the formulas, step time",
        description=__doc__,
    )


def _run(args: Flags) -> int:
    from ..comm import init

    return main(init("mpi4py"), args)
