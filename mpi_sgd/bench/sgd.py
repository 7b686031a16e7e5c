"""Training step time: naive, flat and bucketed gradient averaging against torch DDP and no communication.

For each model, one run times, interleaved (see :mod:`.timing`), a full SGD step (forward,
backward, gradient averaging, momentum update) at per-rank batch B for:

* ``local``    the same step with no communication at all, every rank at once: the floor, since
  the ranks still share the host's cores and memory bandwidth as they do in the runs below;
* ``naive``, ``flat``, ``bucketed``  the strategies of :mod:`mpi_sgd.gradsync` over mpi4py, flat and
  bucketed with their buckets in node-shared memory when ranks share a host (the shared all-reduce
  of :mod:`mpi_sgd.comm.shm.allreduce`);
* ``bucketed-mpi`` bucketed with its buckets in ordinary memory, reduced by MPI's all-reduce;
* ``ddp-gloo`` ``torch.nn.parallel.DistributedDataParallel`` over gloo, defaults untouched:
  what a user of plain PyTorch would run;
* ``ddp-mpi4py`` the same DDP over the ``"mpi4py"`` torch backend (:mod:`mpi_sgd.comm.backends.torch_mpi4py`);
* ``unchecked`` (only when named in ``--variants``) ``bucketed`` without its non-finite check
  (:meth:`mpi_sgd.gradsync.GradSync.outgoing`): set beside ``bucketed``, what that check costs;
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
ratios to DDP and to ``local``. ``exposed ms`` is the step minus the ``local`` step: the
communication a variant did not hide behind compute (DDP's time blocked is not observable from
outside, so this is the one measure all variants share). With ``ddp-mpi4py``, ``ddp-gloo``,
``bucketed`` and ``local`` all in the run, two ratios follow the table: ddp-mpi4py's exposed
communication over ddp-gloo's, and ddp-mpi4py's step over bucketed's. ``--bucket-mb 0.25,1,4,16``
sweeps the bucket size.

``--backend`` picks the communicator of the strategies and of ``comm-only`` (the seam's mpi4py by
default; ``nccl`` with ``--device cuda``), ``--device cuda`` runs on one GPU per local rank, the
clock read after ``torch.cuda.synchronize()``. On one GPU, ``mpiexec -n 1 mpi-sgd bench sgd
--device cuda --backend nccl --variants local,bucketed`` puts the trainer's step over NCCL beside
the same step with no communication: what world size 1 costs on top of a plain torch loop.

A little over 300 lines: one benchmark, whose variants, table, targets and plot all read the same
rows; the parts are each short.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import gradsync
from ..args import UsageError, add_command, choices_list, flag, nonneg_int, positive_floats, positive_int
from ..comm import BACKENDS
from ..comm.buffers import zeros
from ..comm.wrappers.watchdog import without_watchdog
from ..launch import placement
from ..models import BENCHMARK_MLP, build_model
from ..report import Output, markdown_table, new_figure, save_results
from ..timing import WARMUP_STEPS, time_interleaved
from ..trainer import train_step

MODELS = ("mlp", "simplenet")  # --model names, built for 784 features and 10 classes
FEATURES, CLASSES = BENCHMARK_MLP[0], BENCHMARK_MLP[-1]
DDP_BACKENDS = {"ddp-gloo": "gloo", "ddp-mpi4py": "torch-mpi4py"}  # variant -> the seam's torch backend
VARIANTS = ("local", *gradsync.STRATEGIES, "bucketed-mpi", *DDP_BACKENDS, "comm-only")
SHARED_TARGET = 1.10  # a step with shared buckets at most this much slower than one with no communication
NO_WATCHDOG = "bucketed-no-watchdog"  # bucketed without the stall watchdog
OPTIONAL = ("unchecked", NO_WATCHDOG)  # timed only when asked for


@dataclass(frozen=True)
class Flags(Output):
    models: list = flag(list(MODELS), "comma-separated models to time", choices_list(MODELS, "model"))
    variants: list = flag(
        list(VARIANTS),
        f"comma-separated variants, of {','.join(VARIANTS + OPTIONAL)}; {' and '.join(OPTIONAL)} only when named",
        choices_list(VARIANTS + OPTIONAL, "variant"),
    )
    batch_size: int = flag(64, "samples per rank per step", positive_int)
    bucket_mb: list = flag(
        [1.0], "bucket size for 'bucketed' in MB; a comma-separated list sweeps it, e.g. 0.25,1,4,16", positive_floats
    )
    rounds: int = flag(5, "interleaved blocks per variant", positive_int)
    steps_per_round: int = flag(20, "timed steps per block", positive_int)
    warmup: int = flag(WARMUP_STEPS, "discarded steps per variant", nonneg_int)
    seed: int = flag(0, "seed for models and data")
    backend: str = flag("mpi4py", "communicator of the strategies and comm-only", choices=BACKENDS)
    device: str = flag("cpu", "cpu, or cuda: one GPU per local rank")


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
        bare = (
            next(
                (
                    b
                    for b in rows
                    if b["model"] == r["model"] and b["variant"] == r["variant"].replace("bucketed", NO_WATCHDOG, 1)
                ),
                None,
            )
            if r["variant"].startswith("bucketed")
            else None
        )
        if bare is not None and bare is not r:
            out.append(
                f"{r['model']}: {r['variant']} / {bare['variant']} = {r['step_s'] / bare['step_s']:.3f}x per step"
            )
    return out


def _build(name: str, comm, seed: int, device=None):
    torch.manual_seed(seed)
    model = build_model(name, (FEATURES,), CLASSES).to(device or "cpu")
    gradsync.broadcast_parameters(model, comm)
    return model


def variants(names, bucket_mbs) -> list[tuple[str, float | None]]:
    """(variant, bucket MB) pairs: 'bucketed' once per bucket size, the others once."""
    out = []
    for v in names:
        out += [(v, mb) for mb in bucket_mbs] if v.startswith("bucketed") else [(v, None)]
    return out


def verdicts(rows, comm) -> list[str]:
    """The shared-bucket target, per model: the best step with shared buckets (flat or bucketed) within
    SHARED_TARGET of the local one."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = {r["variant"]: r["step_s"] for r in rows if r["model"] == model}
        shared = [v for v in mine if v.split()[0] in ("flat", "bucketed")]
        if "local" not in mine or not shared or comm.size < 2 or not comm.node_shared:
            continue
        best = min(shared, key=mine.get)
        ratio = mine[best] / mine["local"]
        ok = "met" if ratio <= SHARED_TARGET else "NOT met"
        out.append(f"target {model}: step with shared buckets <= {SHARED_TARGET:g}x local: {ok} ({best}: {ratio:.3f}x)")
    return out


def label(variant: str, mb: float | None, sweep: bool) -> str:
    return f"{variant} {mb:g}MB" if sweep and mb is not None else variant


def _spread(samples) -> dict:
    """Mean and standard deviation of per-step figures ([DDP-bench]'s avg/std columns)."""
    a = np.asarray(samples, dtype=float)
    if a.size == 0 or np.isnan(a).all():
        return {"avg": float("nan"), "std": float("nan")}
    return {"avg": float(a.mean()), "std": float(a.std(ddof=1)) if a.size > 1 else 0.0}


def bench_model(comm, name: str, args, ddp_groups: dict | None = None, device=None) -> list[dict]:
    from torch.nn.parallel import DistributedDataParallel

    device = device or torch.device("cpu")
    g = torch.Generator().manual_seed(args.seed + comm.rank)  # each rank its own batch
    x = torch.randn(args.batch_size, FEATURES, generator=g).to(device)
    y = torch.randint(CLASSES, (args.batch_size,), generator=g).to(device)
    sweep = len(args.bucket_mb) > 1
    calls, records = {}, {}
    for variant, mb in variants(args.variants, args.bucket_mb):
        key = label(variant, mb, sweep)
        model = _build(name, comm, args.seed, device)
        torch.manual_seed(args.seed + comm.rank)  # dropout masks differ per rank
        if variant == "comm-only":
            grads = zeros(sum(p.numel() for p in model.parameters()), device=device)
            calls[key] = lambda grads=grads: comm.allreduce(grads, "sum")
            continue
        # bucketed-mpi: bucketed in ordinary memory; unchecked: bucketed without the non-finite check;
        # bucketed-no-watchdog: bucketed on the communicator inside the stall watchdog
        strategy = "bucketed" if variant in OPTIONAL else variant.removesuffix("-mpi")
        if strategy in gradsync.STRATEGIES:
            shared = False if variant.endswith("-mpi") else None
            on = without_watchdog(comm) if variant == NO_WATCHDOG else comm
            sync = gradsync.make(strategy, model, on, mb if mb is not None else args.bucket_mb[0], shared=shared)
            sync.check_finite = variant != "unchecked"
        else:  # local, or DDP, which averages inside backward on its own
            if variant in DDP_BACKENDS:
                model = DistributedDataParallel(model, process_group=ddp_groups[variant])
            sync = gradsync.LocalGradients(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        records[key] = []
        calls[key] = _step_fn(model, optimizer, sync, x, y, records[key], strategy in gradsync.STRATEGIES)
    iterations = args.steps_per_round * args.rounds
    gpu = torch.cuda.synchronize if device.type == "cuda" else None  # kernels finish after the call returns
    times = time_interleaved(comm, calls, iterations=iterations, warmup=args.warmup, rounds=args.rounds, sync=gpu)
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
        r["exposed_s"] = r["step_s"] - ref["local"] if "local" in ref else float("nan")
    return rows


HEADERS = [
    "model",
    "variant",
    "step ms",
    "± std",
    "comm ms",
    "± std",
    "comm frac",
    "x DDP-gloo",
    "x local",
    "exposed ms",
]
EXPOSED_TARGET, STEP_TARGET = 0.35, 1.1  # ddp-mpi4py: exposed vs ddp-gloo's, step vs bucketed's


def targets(rows) -> list[str]:
    """ddp-mpi4py against its two targets, per model, where the run has what they need."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        row = {r["variant"]: r for r in rows if r["model"] == model}
        if not {"local", "bucketed", "ddp-gloo", "ddp-mpi4py"} <= row.keys():
            continue
        ours, gloo, bucketed = row["ddp-mpi4py"], row["ddp-gloo"], row["bucketed"]
        exposed = ours["exposed_s"] / gloo["exposed_s"] if gloo["exposed_s"] > 0 else float("nan")
        step = ours["step_s"] / bucketed["step_s"]
        lines.append(
            f"{model}: ddp-mpi4py exposes {1e3 * ours['exposed_s']:.2f} ms of communication, ddp-gloo "
            f"{1e3 * gloo['exposed_s']:.2f} ms: {exposed:.2f}x (target <= {EXPOSED_TARGET}x: "
            f"{'met' if exposed <= EXPOSED_TARGET else 'NOT met'}); ddp-mpi4py step {1e3 * ours['step_s']:.2f} ms, "
            f"bucketed {1e3 * bucketed['step_s']:.2f} ms: {step:.2f}x (target <= {STEP_TARGET}x: "
            f"{'met' if step <= STEP_TARGET else 'NOT met'})"
        )
    return lines


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
                1e3 * r["exposed_s"],
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


def main(comm, args: Flags) -> int:
    from ..comm.backends.torch_dist import TorchDistComm
    from ..comm.gpu import local_device
    from ..launch import pin_threads

    threads = pin_threads(comm.local_size)
    device = local_device(args.device, comm.local_rank, comm.local_size)
    # Each DDP runs on its own communicator's group, passed explicitly (the first one made also
    # sets up torch's default group; the next gets a new group of its own backend).
    ddp_groups = {v: TorchDistComm(b, comm).group for v, b in DDP_BACKENDS.items() if v in args.variants}
    rows = []
    for name in args.models:
        rows += bench_model(comm, name, args, ddp_groups, device)
    if comm.is_root:
        print(
            f"training step on {device.type}, strategies over {comm.backend}, {comm.size} ranks x batch "
            f"{args.batch_size}, {threads} torch thread(s) per rank, "
            f"bucket {','.join(f'{mb:g}' for mb in args.bucket_mb)} MB, median of {args.rounds} interleaved "
            f"blocks of {args.steps_per_round} steps, slowest rank; ± std over its steps; comm = time blocked in "
            "gradient communication\n"
        )
        print(table(rows))
        lines = verdicts(rows, comm) + targets(rows)
        if lines:
            print("\n" + "\n".join(lines))
        for line in watchdog_costs(rows):
            print(f"watchdog: {line}")
        payload = {
            "world_size": comm.size,
            "batch_size": args.batch_size,
            "threads": threads,
            "bucket_mb": args.bucket_mb,
            "backend": comm.backend,
            "device": device.type,
            "rows": rows,
        }
        save_results(args, f"sgd-n{comm.size}", payload, lambda png: plot(rows, png))
    return 0


def add_parser(kinds) -> None:
    """``mpi-sgd bench sgd``: register on the ``bench`` command's sub-parsers."""
    add_command(
        kinds,
        "sgd",
        Flags,
        _run,
        help="training step time: naive/flat/bucketed vs DDP over gloo and over mpi4py vs no communication",
        description=__doc__,
    )


def _run(args: Flags) -> int:
    from ..comm import init
    from ..config import TrainConfig

    try:  # a missing GPU or backend: one line, before any communication
        TrainConfig(backend=args.backend, device=args.device).check_machine(placement().size)
    except ValueError as e:
        raise UsageError(str(e)) from None
    ddp = [v for v in args.variants if v in DDP_BACKENDS]
    if not args.device.startswith("cpu") and ddp:  # the GPU is there: say what cannot use it
        raise UsageError(
            f"{', '.join(ddp)} run on the CPU (the mpi4py torch backend takes CPU tensors): "
            "leave them out of --variants with --device cuda"
        )
    return main(init(args.backend), args)
