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
* ``noise-scale`` (only when named) ``bucketed`` measuring the gradient noise scale as
  ``--noise-scale`` does (:mod:`mpi_sgd.noisescale`): set beside ``bucketed``, what measuring it costs;
* ``bucketed-alone`` (only when named) ``bucketed`` over a one-rank communicator: the hooks, the
  copies into and out of the buckets, the check and the scaling, with nothing to wait for. With
  ``local``, ``unchecked`` and ``comm-only`` beside it, the report splits ``bucketed``'s step into
  where its time goes (:func:`.sgd_report.breakdown`);
* ``local-synced`` (only when named) ``local`` with a barrier after each step: what waiting for the
  slower rank costs a synchronous step before a byte of gradient moves;
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

The variants are data (:data:`TABLE`, one :class:`Variant` each); the table, the plot and the
verdicts are :mod:`.sgd_report`'s.

Why over 300 lines: what is left is one benchmark's measuring (the variants' steps, interleaved
on every rank) and its flags; the report is already apart, and the rest is one loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .. import gradsync
from ..args import UsageError, add_command, choices_list, flag, nonneg_int, positive_floats, positive_int
from ..comm import BACKENDS
from ..comm.backends.local import LocalComm
from ..comm.buffers import zeros
from ..comm.wrappers.watchdog import without_watchdog
from ..config import TrainConfig
from ..launch import placement
from ..models import BENCHMARK_MLP, build_model
from ..noisescale import NoiseProbe
from ..replicas import replicate
from ..report import Output, save_results
from ..step import make_optimizer, train_step
from ..timing import WARMUP_STEPS, time_interleaved
from .sgd_report import add_ratios, breakdown, plot, spread, table, targets, verdicts, watchdog_costs

MODELS = ("mlp", "simplenet")  # --model names, built for 784 features and 10 classes
FEATURES, CLASSES = BENCHMARK_MLP[0], BENCHMARK_MLP[-1]
OPTIMIZER = TrainConfig(optimizer="sgd", lr=0.01, momentum=0.9)  # every variant's


@dataclass(frozen=True)
class Variant:
    """One way to run the step: which averaging, and the one thing that differs from its plain form."""

    name: str
    strategy: str | None = None  # a gradsync strategy; None: the strategy averages nothing (local, DDP)
    shared: bool | None = None  # buckets in node-shared memory when the communicator offers it, or never (False)
    checked: bool = True  # the non-finite check of every sent buffer (GradSync.outgoing)
    watchdog: bool = True  # on the communicator inside the stall watchdog, as every job runs
    ddp: str | None = None  # DistributedDataParallel over the seam's torch backend of this name
    comm_only: bool = False  # no training: one all-reduce as large as all the gradients
    noise: bool = False  # measuring the gradient noise scale (mpi_sgd.noisescale)
    alone: bool = False  # over a one-rank communicator: the strategy's own work, nothing to wait for
    synced: bool = False  # a barrier after each step (local-synced)
    sweeps: bool = False  # timed once per --bucket-mb
    optional: bool = False  # timed only when named in --variants

    @property
    def shared_buckets(self) -> bool:
        """The plain flat or bucketed step with its buckets where the communicator shares memory."""
        plain = self.shared is None and self.checked and self.watchdog and not (self.noise or self.alone)
        return self.strategy in ("flat", "bucketed") and plain


TABLE = {
    v.name: v
    for v in (
        Variant("local"),
        *(Variant(s, s, sweeps=s == "bucketed") for s in gradsync.STRATEGIES),
        Variant("bucketed-mpi", "bucketed", shared=False, sweeps=True),
        Variant("ddp-gloo", ddp="gloo"),
        Variant("ddp-mpi4py", ddp="torch-mpi4py"),
        Variant("comm-only", comm_only=True),
        Variant("unchecked", "bucketed", checked=False, optional=True),
        Variant("noise-scale", "bucketed", noise=True, optional=True),
        Variant("bucketed-no-watchdog", "bucketed", watchdog=False, sweeps=True, optional=True),
        Variant("bucketed-alone", "bucketed", alone=True, optional=True),
        Variant("local-synced", synced=True, optional=True),
    )
}
VARIANTS = tuple(n for n, v in TABLE.items() if not v.optional)  # the default --variants
OPTIONAL = tuple(n for n, v in TABLE.items() if v.optional)


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


def _step_fn(model, optimizer, sync, x, y, record, blocked: bool, barrier=None):
    """The trainer's step as a call to time; each call appends ``(step seconds, seconds blocked in
    communication)`` to ``record``, so the per-step spread ([DDP-bench]'s std columns) comes for
    free. ``blocked`` False: the time blocked is not known (DDP communicates inside backward).
    ``barrier``: called after each step, inside its time (local-synced)."""

    def step():
        s = train_step(model, optimizer, sync, x, y)
        if barrier is None:
            record.append((s.seconds, s.t_sync if blocked else float("nan")))
            return
        t0 = time.perf_counter()
        barrier()
        waited = time.perf_counter() - t0
        record.append((s.seconds + waited, waited))

    return step


def variants(names, bucket_mbs) -> list[tuple[str, float | None]]:
    """(variant, bucket MB) pairs: each variant that sweeps once per bucket size, the others once."""
    out = []
    for v in names:
        out += [(v, mb) for mb in bucket_mbs] if TABLE[v].sweeps else [(v, None)]
    return out


def label(variant: str, mb: float | None, sweep: bool) -> str:
    return f"{variant} {mb:g}MB" if sweep and mb is not None else variant


def bench_model(comm, name: str, args, ddp_groups: dict | None = None, device=None) -> list[dict]:
    from torch.nn.parallel import DistributedDataParallel

    device = device or torch.device("cpu")
    g = torch.Generator().manual_seed(args.seed + comm.rank)  # each rank its own batch
    x = torch.randn(args.batch_size, FEATURES, generator=g).to(device)
    y = torch.randint(CLASSES, (args.batch_size,), generator=g).to(device)
    sweep = len(args.bucket_mb) > 1
    calls, records, specs = {}, {}, {}  # specs: label -> (variant, bucket MB)
    for variant, mb in variants(args.variants, args.bucket_mb):
        key, spec = label(variant, mb, sweep), TABLE[variant]
        specs[key] = (variant, mb)
        model = replicate(lambda: build_model(name, (FEATURES,), CLASSES).to(device), comm, args.seed)
        if spec.comm_only:
            grads = zeros(sum(p.numel() for p in model.parameters()), device=device)
            calls[key] = lambda grads=grads: comm.allreduce(grads, "sum")
            continue
        if spec.strategy is not None:
            on = LocalComm() if spec.alone else comm if spec.watchdog else without_watchdog(comm)
            bucket_mb = mb if mb is not None else args.bucket_mb[0]
            sync = gradsync.make(spec.strategy, model, on, bucket_mb, shared=spec.shared)
            sync.check_finite = spec.checked
            if spec.noise:
                numel = sum(p.numel() for p in sync.params)
                sync.noise = NoiseProbe(args.batch_size, 1, comm.size, numel, device)
        else:  # local, or DDP, which averages inside backward on its own
            if spec.ddp is not None:
                model = DistributedDataParallel(model, process_group=ddp_groups[variant])
            sync = gradsync.LocalGradients(model)
        records[key] = []
        calls[key] = _step_fn(
            model,
            make_optimizer(OPTIMIZER, model),
            sync,
            x,
            y,
            records[key],
            spec.strategy is not None,
            comm.barrier if spec.synced else None,
        )
    iterations = args.steps_per_round * args.rounds
    gpu = torch.cuda.synchronize if device.type == "cuda" else None  # kernels finish after the call returns
    times = time_interleaved(comm, calls, iterations=iterations, warmup=args.warmup, rounds=args.rounds, sync=gpu)
    rows = []
    for key in calls:
        steps = records.get(key, [])[args.warmup :]  # what the warm-up ran is not timed
        mine = {
            "step": spread([t for t, _ in steps]),
            "comm": spread([c for _, c in steps]),
            "comm_frac": spread([c / t for t, c in steps]),
        }
        # The slowest rank sets the pace of synchronous SGD; report its spread with its median.
        everyone = comm.allgather_obj(mine)
        slowest = max(everyone, key=lambda m: m["step"]["avg"]) if steps else mine
        rows.append(
            {
                "model": name,
                "variant": key,
                "name": specs[key][0],
                "bucket_mb": specs[key][1],
                "step_s": times[key].max,
                "step_blocks": list(times[key].blocks),  # the slowest rank's, per interleaved block
                "step_s_min_rank": times[key].min,
                "step_std_s": slowest["step"]["std"],
                "comm_s": slowest["comm"]["avg"],
                "comm_std_s": slowest["comm"]["std"],
                "comm_frac": slowest["comm_frac"]["avg"],
                "comm_frac_std": slowest["comm_frac"]["std"],
            }
        )
    return add_ratios(rows, not_steps={n for n, v in TABLE.items() if v.comm_only})


def main(comm, args: Flags) -> int:
    from ..comm.backends.torch_dist import TorchDistComm
    from ..comm.gpu import local_device
    from ..launch import pin_threads

    threads = pin_threads(comm.local_size)
    device = local_device(args.device, comm.local_rank, comm.local_size)
    # Each DDP runs on its own communicator's group, passed explicitly (the first one made also
    # sets up torch's default group; the next gets a new group of its own backend).
    ddp_groups = {v: TorchDistComm(TABLE[v].ddp, comm).group for v in args.variants if TABLE[v].ddp}
    rows = []
    for name in args.models:
        rows += bench_model(comm, name, args, ddp_groups, device)
    if comm.is_root:
        print(
            f"training step on {device.type}, strategies over {comm.backend}, {comm.size} ranks x batch "
            f"{args.batch_size}, {threads} torch thread(s) per rank,\n"
            f"bucket {','.join(f'{mb:g}' for mb in args.bucket_mb)} MB, median of {args.rounds} interleaved "
            f"blocks of {args.steps_per_round} steps, slowest rank; ± std over its steps;\n"
            "comm = time blocked in gradient communication\n"
        )
        print(table(rows))
        shared = [n for n, v in TABLE.items() if v.shared_buckets]
        lines = verdicts(rows, comm, shared) + targets(rows)
        if lines:
            print("\n" + "\n".join(lines))
        watched = {n: v.strategy for n, v in TABLE.items() if not v.watchdog}
        for line in watchdog_costs(rows, watched):
            print(f"watchdog: {line}")
        for model in args.models:
            lines = breakdown([r for r in rows if r["model"] == model])
            if lines:
                print(f"\nwhere bucketed's step goes, {model} (ms per step, medians of interleaved variants):")
                print("\n".join(lines))
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

    try:  # a missing GPU or backend: one line, before any communication
        TrainConfig(backend=args.backend, device=args.device).check_machine(placement().size)
    except ValueError as e:
        raise UsageError(str(e)) from None
    ddp = [v for v in args.variants if TABLE[v].ddp]
    if not args.device.startswith("cpu") and ddp:  # the GPU is there: say what cannot use it
        raise UsageError(
            f"{', '.join(ddp)} run on the CPU (the mpi4py torch backend takes CPU tensors): "
            "leave them out of --variants with --device cuda"
        )
    return main(init(args.backend), args)
