"""Training step time: naive, flat and bucketed gradient averaging against torch DDP and no communication.

For each model, one run times, interleaved (see :mod:`.timing`), a full SGD step (forward,
backward, gradient averaging, momentum update) at per-rank batch B for:

* ``local``    the same step with no communication at all, every rank at once: the floor, since
  the ranks still share the host's cores and memory bandwidth as they do in the runs below;
* ``naive``, ``flat``, ``bucketed``  the strategies of :mod:`mpi_sgd.gradsync` over mpi4py;
* ``ddp-gloo`` ``torch.nn.parallel.DistributedDataParallel`` over gloo, defaults untouched:
  what a user of plain PyTorch would run;
* ``bucketed-no-watchdog`` (only when asked for) ``bucketed`` on the communicator under the stall
  watchdog that ``comm.init`` puts around every job: ``bucketed`` over this is what the watchdog
  costs per step (its thread runs in both);
* ``comm-only`` no training, just one blocking all-reduce of a buffer the size of all the
  model's gradients: the communication a step cannot avoid, shown for scale. Without overlap a
  step costs at least ``local`` + ``comm-only``; overlap can hide part of it only where a core
  is free to move the bytes while backward runs.

Each rank's figure is its median block; the table shows the slowest rank (it sets the pace of
synchronous SGD) and, as [DDP-bench]'s naive/flat/overlap table does, the mean and standard
deviation over that rank's steps of the step time, of the time blocked in communication
(``comm``) and of their ratio (``comm frac``; "overlap" there is ``bucketed`` here), then the
ratios to DDP and to ``local``. ``--bucket-mb 0.25,1,4,16`` sweeps the bucket size.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import gradsync
from ..args import positive_floats
from ..comm.buffers import zeros
from ..comm.watchdog import without_watchdog
from ..models import BENCHMARK_MLP, build_model
from ..report import add_output_arguments, markdown_table, new_figure, save_results
from ..timing import WARMUP_STEPS, time_interleaved
from ..trainer import train_step

MODELS = ("mlp", "simplenet")  # --model names, built for 784 features and 10 classes
FEATURES, CLASSES = BENCHMARK_MLP[0], BENCHMARK_MLP[-1]
VARIANTS = ("local", *gradsync.STRATEGIES, "ddp-gloo", "comm-only")
NO_WATCHDOG = "bucketed-no-watchdog"  # not run unless named in --variants


def _step_fn(model, optimizer, sync, x, y, record, blocked: bool):
    """The trainer's step as a call to time; each call appends ``(step seconds, seconds blocked in
    communication)`` to ``record``, so the per-step spread ([DDP-bench]'s std columns) comes for
    free. ``blocked`` False: the time blocked is not known (DDP communicates inside backward)."""

    def step():
        s = train_step(model, optimizer, sync, x, y)
        record.append((s.seconds, s.t_sync if blocked else float("nan")))

    return step


def watchdog_costs(rows) -> list[str]:
    """'simplenet: bucketed / bucketed-no-watchdog = 1.004x per step' for each model (and bucket size)."""
    out = []
    for r in rows:
        bare = next((b for b in rows if b["model"] == r["model"] and b["variant"] == r["variant"].replace(
            "bucketed", NO_WATCHDOG, 1)), None) if r["variant"].startswith("bucketed") else None  # fmt: skip
        if bare is not None and bare is not r:
            out.append(
                f"{r['model']}: {r['variant']} / {bare['variant']} = {r['step_s'] / bare['step_s']:.3f}x per step"
            )
    return out


def _build(name: str, comm, seed: int):
    torch.manual_seed(seed)
    model = build_model(name, (FEATURES,), CLASSES)
    gradsync.broadcast_parameters(model, comm)
    return model


def variants(names, bucket_mbs) -> list[tuple[str, float | None]]:
    """(variant, bucket MB) pairs: 'bucketed' once per bucket size, the others once."""
    out = []
    for v in names:
        out += [(v, mb) for mb in bucket_mbs] if v in ("bucketed", NO_WATCHDOG) else [(v, None)]
    return out


def label(variant: str, mb: float | None, sweep: bool) -> str:
    return f"{variant} {mb:g}MB" if sweep and mb is not None else variant


def _spread(samples) -> dict:
    """Mean and standard deviation of per-step figures ([DDP-bench]'s avg/std columns)."""
    a = np.asarray(samples, dtype=float)
    if a.size == 0 or np.isnan(a).all():
        return {"avg": float("nan"), "std": float("nan")}
    return {"avg": float(a.mean()), "std": float(a.std(ddof=1)) if a.size > 1 else 0.0}


def bench_model(comm, name: str, args, ddp_group=None) -> list[dict]:
    from torch.nn.parallel import DistributedDataParallel

    g = torch.Generator().manual_seed(args.seed + comm.rank)  # each rank its own batch
    x = torch.randn(args.batch_size, FEATURES, generator=g)
    y = torch.randint(CLASSES, (args.batch_size,), generator=g)
    sweep = len(args.bucket_mb) > 1
    calls, records = {}, {}
    for variant, mb in variants(args.variants, args.bucket_mb):
        key = label(variant, mb, sweep)
        model = _build(name, comm, args.seed)
        torch.manual_seed(args.seed + comm.rank)  # dropout masks differ per rank
        if variant == "comm-only":
            grads = zeros(sum(p.numel() for p in model.parameters()))
            calls[key] = lambda grads=grads: comm.allreduce(grads, "sum")
            continue
        if variant in gradsync.STRATEGIES:
            sync = gradsync.make(variant, model, comm, mb if mb is not None else args.bucket_mb[0])
        elif variant == NO_WATCHDOG:
            sync = gradsync.make("bucketed", model, without_watchdog(comm), mb)
        else:  # local, or DDP, which averages inside backward on its own
            if variant == "ddp-gloo":
                model = DistributedDataParallel(model, process_group=ddp_group)
            sync = gradsync.LocalGradients(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        records[key] = []
        timed_sync = variant in gradsync.STRATEGIES or variant == NO_WATCHDOG
        calls[key] = _step_fn(model, optimizer, sync, x, y, records[key], timed_sync)
    iterations = args.steps_per_round * args.rounds
    times = time_interleaved(comm, calls, iterations=iterations, warmup=args.warmup, rounds=args.rounds)
    rows = []
    for key in calls:
        steps = records.get(key, [])[args.warmup :]  # what the warm-up ran is not timed
        mine = {
            "step": _spread([t for t, _ in steps]),
            "comm": _spread([c for _, c in steps]),
            "comm_frac": _spread([c / t for t, c in steps]),
        }
        # The slowest rank sets the pace of synchronous SGD; report its spread with its median.
        everyone = comm.allgather_obj(mine)
        spread = max(everyone, key=lambda m: m["step"]["avg"]) if steps else mine
        rows.append(
            {
                "model": name,
                "variant": key,
                "step_s": times[key].max,
                "step_s_min_rank": times[key].min,
                "step_std_s": spread["step"]["std"],
                "comm_s": spread["comm"]["avg"],
                "comm_std_s": spread["comm"]["std"],
                "comm_frac": spread["comm_frac"]["avg"],
                "comm_frac_std": spread["comm_frac"]["std"],
            }
        )
    ref = {r["variant"]: r["step_s"] for r in rows}
    for r in rows:
        r["vs_ddp"] = r["step_s"] / ref["ddp-gloo"] if "ddp-gloo" in ref else float("nan")
        r["vs_local"] = r["step_s"] / ref["local"] if "local" in ref else float("nan")
    return rows


HEADERS = ["model", "variant", "step ms", "± std", "comm ms", "± std", "comm frac", "x DDP-gloo", "x local"]


def table(rows) -> str:
    return markdown_table(
        HEADERS,
        [
            [
                r["model"],
                r["variant"],
                1e3 * r["step_s"],
                1e3 * r["step_std_s"],
                1e3 * r["comm_s"],
                1e3 * r["comm_std_s"],
                r["comm_frac"],
                r["vs_ddp"],
                r["vs_local"],
            ]
            for r in rows
        ],
    )


def plot(rows, path) -> None:
    """Step time per variant, the part blocked in communication stacked at the bottom."""
    fig, axes = new_figure(1, len({r["model"] for r in rows}), figsize=(11, 4), squeeze=False)
    for ax, model in zip(axes[0], dict.fromkeys(r["model"] for r in rows), strict=False):
        mine = [r for r in rows if r["model"] == model and r["variant"] != "comm-only"]
        names = [r["variant"] for r in mine]
        step = [1e3 * r["step_s"] for r in mine]
        comm = [0.0 if r["comm_s"] != r["comm_s"] else 1e3 * r["comm_s"] for r in mine]
        ax.bar(names, step, color="tab:blue", label="step")
        ax.bar(names, comm, color="tab:orange", label="blocked in communication")
        ax.set_title(model)
        ax.set_ylabel("ms per step")
        ax.tick_params(axis="x", rotation=45)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(comm, args) -> int:
    from ..launch import pin_threads

    threads = pin_threads(comm.local_size)
    ddp_group = None
    if "ddp-gloo" in args.variants:
        from ..comm.torch_dist import TorchDistComm

        ddp_group = TorchDistComm("gloo", comm).group  # DDP runs on this group, passed explicitly
    rows = []
    for name in args.models:
        rows += bench_model(comm, name, args, ddp_group)
    if comm.is_root:
        print(
            f"training step, {comm.size} ranks x batch {args.batch_size}, {threads} torch thread(s) per rank, "
            f"bucket {','.join(f'{mb:g}' for mb in args.bucket_mb)} MB, median of {args.rounds} interleaved "
            f"blocks of {args.steps_per_round} steps, slowest rank; ± std over its steps; comm = time blocked in "
            "gradient communication\n"
        )
        print(table(rows))
        for line in watchdog_costs(rows):
            print(f"watchdog: {line}")
        payload = {"world_size": comm.size, "batch_size": args.batch_size, "threads": threads,
                   "bucket_mb": args.bucket_mb, "rows": rows}  # fmt: skip
        save_results(args, f"sgd-n{comm.size}", payload, lambda png: plot(rows, png))
    return 0


def add_parser(kinds) -> None:
    """``mpi-sgd bench sgd``: register on the ``bench`` command's sub-parsers."""
    p = kinds.add_parser(
        "sgd",
        help="training step time: naive/flat/bucketed vs DDP-gloo vs no communication",
        description=__doc__,
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
        help=f"comma-separated variants: {','.join(VARIANTS)} (default all), and {NO_WATCHDOG} (bucketed without "
        "the stall watchdog, to time what it costs)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank per step (default 64)")
    p.add_argument(
        "--bucket-mb",
        type=positive_floats,
        default=[1.0],
        help="bucket size for 'bucketed' in MB; a comma-separated list sweeps it, e.g. 0.25,1,4,16 (default 1)",
    )
    p.add_argument("--rounds", type=int, default=5, help="interleaved blocks per variant (default 5)")
    p.add_argument("--steps-per-round", type=int, default=20, help="timed steps per block (default 20)")
    p.add_argument("--warmup", type=int, default=WARMUP_STEPS,
                   help=f"discarded steps per variant (default {WARMUP_STEPS})")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed for models and data (default 0)")
    add_output_arguments(p)
    p.set_defaults(func=_run, parser=p)


def _run(args) -> int:
    from ..comm import init

    bad = [m for m in args.models if m not in MODELS] + [v for v in args.variants if v not in (*VARIANTS, NO_WATCHDOG)]
    if bad:
        args.parser.error(f"unknown model(s)/variant(s): {', '.join(bad)}")
    if min(args.batch_size, args.steps_per_round, args.rounds) < 1 or args.warmup < 0:
        args.parser.error("--batch-size, --steps-per-round and --rounds must be at least 1, --warmup 0 or more")
    return main(init("mpi4py"), args)
