"""[DDP-scaling]'s grid: how one process's training time grows with model size and data size.

    mpi-sgd bench grid                 # models 0x10, 3x100, 3x400 by 16384 and 131072 samples
    mpi-sgd bench grid --tiny          # seconds, for tests

Each cell trains :class:`~mpi_sgd.models.FFNet` (100 inputs, ``L`` hidden layers of width ``W``,
one output; MSE loss, SGD with momentum, batch 32 as in the seed) with the trainer's own step
on random data for ``--epochs`` epochs and reports the median of ``--repeats`` runs.
[DDP-scaling]'s point is that time grows with the product of model and data, not their sum: 10x
the parameters and 10x the samples cost about 100x, which is what drives training onto more than
one process. The table shows each cell's time relative
to the smallest cell beside the ratio of parameters x samples.

One process, no communication: run it with plain ``mpi-sgd bench grid``. Data are tensors
sliced into batches (no DataLoader), so the figures are the model's compute plus the step's fixed
Python cost, which dominates the smallest models. torch runs one thread unless ``--threads``
says otherwise: these models are too small to gain from more, and on a busy machine idle
intra-op threads spin against other jobs and slow small steps tenfold.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

from ..args import add_command, depths_by_widths, flag, positive_int, rank_list
from ..report import Output, markdown_table, new_figure, save_results
from ..timing import WARMUP_STEPS

INPUTS = 100


@dataclass(frozen=True)
class Flags(Output):
    models: list = flag([(0, 10), (3, 100), (3, 400)], "LAYERSxWIDTH list", depths_by_widths)
    samples: list = flag([16384, 131072], "samples per epoch", rank_list)
    batch_size: int = flag(32, "batch size, as in the seed", positive_int)
    epochs: int = flag(1, "epochs per run", positive_int)
    repeats: int = flag(3, "runs per cell; the median is reported", positive_int)
    threads: int = flag(1, "torch intra-op threads", positive_int)
    tiny: bool = flag(False, "two tiny models on 256 and 2048 samples, one run each (in place of the three above)")


def train_seconds(layers: int, width: int, samples: int, batch: int, epochs: int, repeats: int) -> tuple[float, int]:
    """Median wall seconds to train one freshly built model for ``epochs``; and its parameter count."""
    import torch

    from ..config import TrainConfig
    from ..gradsync import LocalGradients
    from ..models import FFNet
    from ..step import make_optimizer, train_step

    torch.manual_seed(0)
    x, y = torch.randn(samples, INPUTS), torch.randn(samples, 1)
    times = []
    for rep in range(repeats + 1):
        model = FFNet(INPUTS, num_hl=layers, hl_size=width, num_outputs=1)
        opt = make_optimizer(TrainConfig(optimizer="sgd", lr=1e-3, momentum=0.9), model)
        sync = LocalGradients(model)  # one process: nothing to average
        # Run 0 is a warm-up of a few steps: the first calls pay for allocator and kernel set-up.
        steps = range(0, min(samples, WARMUP_STEPS * batch), batch) if rep == 0 else range(0, samples, batch)
        t0 = time.perf_counter()
        for _ in range(epochs):
            for i in steps:
                train_step(model, opt, sync, x[i : i + batch], y[i : i + batch])
        if rep > 0:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), sum(p.numel() for p in model.parameters())


def run(models, samples_list, batch=32, epochs=1, repeats=3) -> list[dict]:
    rows = []
    for layers, width in models:
        for samples in samples_list:
            seconds, params = train_seconds(layers, width, samples, batch, epochs, repeats)
            rows.append(dict(model=f"{layers}x{width}", params=params, samples=samples, seconds=seconds))
    return rows


def table(rows) -> str:
    base = min(rows, key=lambda r: r["params"] * r["samples"])
    headers = ["model", "params", "samples", "seconds", "x time", "x params*samples"]
    body = [
        [
            r["model"],
            r["params"],
            r["samples"],
            r["seconds"],
            f"{r['seconds'] / base['seconds']:.1f}",
            f"{r['params'] * r['samples'] / (base['params'] * base['samples']):.1f}",
        ]
        for r in rows
    ]
    return markdown_table(headers, body)


def plot(rows, path) -> None:
    fig, ax = new_figure(figsize=(6, 4))
    for model in dict.fromkeys(r["model"] for r in rows):
        pts = [(r["samples"], r["seconds"]) for r in rows if r["model"] == model]
        params = next(r["params"] for r in rows if r["model"] == model)
        ax.loglog(*zip(*pts, strict=True), "o-", label=f"{model} ({params:,} params)")
    ax.set_xlabel("samples per epoch")
    ax.set_ylabel("training time (s)")
    ax.set_title("one process: time grows with model x data")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args: Flags) -> int:
    import torch

    torch.set_num_threads(args.threads)
    if args.tiny:
        args = replace(args, models=[(0, 10), (2, 64)], samples=[256, 2048], repeats=1)
    rows = run(args.models, args.samples, args.batch_size, args.epochs, args.repeats)
    print(
        f"# training time: one process, {args.threads} thread(s), batch {args.batch_size}, {args.epochs} epoch(s), "
        f"median of {args.repeats}"
    )
    print(table(rows))
    payload = {"benchmark": "grid", "batch": args.batch_size, "rows": rows}
    save_results(args, "grid", payload, lambda png: plot(rows, png))
    return 0


def add_parser(subparsers) -> None:
    add_command(
        subparsers,
        "grid",
        Flags,
        main,
        help="[DDP-scaling]: training time over model size x data size (one process)",
        description=__doc__,
    )
