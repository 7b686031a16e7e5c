"""Training step time: naive, flat and bucketed gradient averaging against torch DDP and no communication.

For each model, one run times, interleaved (see :mod:`.timing`), a full SGD step (forward,
backward, gradient averaging, momentum update) at per-rank batch B for:

* ``local``    the same step with no communication at all, every rank at once: the floor, since
  the ranks still share the host's cores and memory bandwidth as they do in the runs below;
* ``naive``, ``flat``, ``bucketed``  the strategies of :mod:`mpi_sgd.gradsync` over mpi4py;
* ``ddp-gloo`` ``torch.nn.parallel.DistributedDataParallel`` over gloo, defaults untouched:
  what a user of plain PyTorch would run;
* ``comm-only`` no training, just one blocking all-reduce of a buffer the size of all the
  model's gradients: the communication a step cannot avoid, shown for scale. Without overlap a
  step costs at least ``local`` + ``comm-only``; overlap can hide part of it only where a core
  is free to move the bytes while backward runs.

Each rank's figure is its median block; the table shows the slowest rank (it sets the pace of
synchronous SGD), ``blocked`` the mean time per step a strategy spent waiting in communication,
and the ratios to DDP and to ``local``.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F

from .. import gradsync
from ..comm.buffers import zeros
from ..models import MLP, SimpleNet
from .report import markdown_table, write_json
from .timing import time_interleaved

MODELS = {
    "mlp": lambda: MLP((784, 1024, 1024, 10)),
    "simplenet": lambda: SimpleNet(784, 256, 10),
}
VARIANTS = ("local", "naive", "flat", "bucketed", "ddp-gloo", "comm-only")


def _step_fn(model, optimizer, x, y, sync=None):
    """One training step; ``sync`` None means plain torch (local, or DDP inside its hooks)."""
    if sync is None:

        def step():
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

        return step

    def step():
        sync.zero_grad()
        with sync.accumulate():
            (F.cross_entropy(model(x), y) * sync.loss_scale).backward()
        sync.wait()
        optimizer.step()

    return step


def _build(name: str, comm, seed: int):
    torch.manual_seed(seed)
    model = MODELS[name]()
    gradsync.broadcast_parameters(model, comm)
    return model


def bench_model(comm, name: str, args) -> list[dict]:
    from torch.nn.parallel import DistributedDataParallel

    g = torch.Generator().manual_seed(args.seed + comm.rank)  # each rank its own batch
    x = torch.randn(args.batch_size, 784, generator=g)
    y = torch.randint(10, (args.batch_size,), generator=g)
    calls, syncs = {}, {}
    for variant in args.variants:
        model = _build(name, comm, args.seed)
        torch.manual_seed(args.seed + comm.rank)  # dropout masks differ per rank
        sync = None
        if variant in gradsync.STRATEGIES:
            sync = syncs[variant] = gradsync.make(variant, model, comm, args.bucket_mb)
        elif variant == "ddp-gloo":
            model = DistributedDataParallel(model)
        elif variant == "comm-only":
            grads = zeros(sum(p.numel() for p in model.parameters()))
            calls[variant] = lambda grads=grads: comm.allreduce(grads, "sum")
            continue
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        calls[variant] = _step_fn(model, optimizer, x, y, sync)
    times = time_interleaved(comm, calls, iterations=args.steps * args.rounds, warmup=args.warmup, rounds=args.rounds)
    total_calls = args.warmup + args.steps * args.rounds  # what time_interleaved runs
    rows = []
    for variant in args.variants:
        blocked = syncs[variant].seconds / total_calls if variant in syncs else float("nan")
        rows.append(
            {
                "model": name,
                "variant": variant,
                "step_s": times[variant].max,
                "step_s_min_rank": times[variant].min,
                "blocked_s": max(comm.allgather_obj(blocked)),
            }
        )
    ref = {r["variant"]: r["step_s"] for r in rows}
    for r in rows:
        r["vs_ddp"] = r["step_s"] / ref["ddp-gloo"] if "ddp-gloo" in ref else float("nan")
        r["vs_local"] = r["step_s"] / ref["local"] if "local" in ref else float("nan")
    return rows


def main(comm, args) -> int:
    from ..launch import pin_threads

    threads = pin_threads(comm.local_size)
    if "ddp-gloo" in args.variants:
        from ..comm.torch_dist import TorchDistComm

        TorchDistComm("gloo", comm)  # sets up torch.distributed's default process group for DDP
    rows = []
    for name in args.models:
        rows += bench_model(comm, name, args)
    if comm.is_root:
        print(
            f"training step, {comm.size} ranks x batch {args.batch_size}, {threads} torch thread(s) per rank, "
            f"bucket {args.bucket_mb:g} MB, median of {args.rounds} interleaved blocks of {args.steps} steps, "
            "slowest rank\n"
        )
        table = [
            [r["model"], r["variant"], 1e3 * r["step_s"], 1e3 * r["blocked_s"], r["vs_ddp"], r["vs_local"]]
            for r in rows
        ]
        print(markdown_table(["model", "variant", "step ms", "blocked ms", "x DDP-gloo", "x local"], table))
        if args.json:
            write_json(
                args.json,
                {
                    "world_size": comm.size,
                    "batch_size": args.batch_size,
                    "threads": threads,
                    "bucket_mb": args.bucket_mb,
                    "rows": rows,
                },
            )
    return 0


def add_parser(kinds) -> None:
    """``mpi-sgd bench sgd``: register on the ``bench`` command's sub-parsers."""
    p = kinds.add_parser(
        "sgd",
        help="training step time: naive/flat/bucketed vs DDP-gloo vs no communication",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--models",
        type=lambda s: s.split(","),
        default=list(MODELS),
        help=f"comma-separated models to time: {','.join(MODELS)} (default all)",
    )
    p.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=list(VARIANTS),
        help=f"comma-separated variants: {','.join(VARIANTS)} (default all)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank per step (default 64)")
    p.add_argument("--bucket-mb", type=float, default=1.0, help="bucket size for 'bucketed' in MB (default 1)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per block (default 20)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved blocks per variant (default 5)")
    p.add_argument("--warmup", type=int, default=5, help="discarded steps per variant (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed for models and data (default 0)")
    p.add_argument("--json", default=None, help="also write the rows here as JSON")
    p.set_defaults(func=_run, parser=p)


def _run(args) -> int:
    from ..comm import init

    bad = [m for m in args.models if m not in MODELS] + [v for v in args.variants if v not in VARIANTS]
    if bad:
        args.parser.error(f"unknown model(s)/variant(s): {', '.join(bad)}")
    if min(args.batch_size, args.steps, args.rounds) < 1 or args.warmup < 0 or args.bucket_mb <= 0:
        args.parser.error(
            "--batch-size, --steps and --rounds must be at least 1, --warmup 0 or more, --bucket-mb positive"
        )
    return main(init("mpi4py"), args)
