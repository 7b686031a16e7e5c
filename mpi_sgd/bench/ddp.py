"""``bench ddp``: where a step of torch DDP over the ``"mpi4py"`` backend spends the time it adds.

``bench sgd`` times DDP's step whole; "exposed" there is DDP's step minus the same step with no
communication, and DDP's time blocked is not observable from outside. From inside the backend it
is: the progress threads (:mod:`mpi_sgd.comm.backends.progress`) note when each bucket's
all-reduce started, when the waiter thread took it, when MPI finished it and when its work was
settled (the future DDP waits on completed). With the step's own clock readings around forward,
backward and the optimizer, each step of DDP splits into:

* **forward**: DDP's work before the model's own forward (its pre-forward hooks), over ``local``'s
  forward;
* **to the last bucket**: from the start of backward until the last bucket's all-reduce starts,
  over ``local``'s whole backward: DDP's autograd hooks and its copies of the gradients into its
  bucket buffers, which backward's compute does not include;
* **all-reduce after it**: from the last bucket's start until MPI finished the last one: the
  communication that no computation hid (on a host with no free core, nearly all of it);
* **after MPI**: from then until backward returns: the work's settling (DDP's future callback,
  which divides the bucket by the world size) and DDP's finalisation (copying the averaged
  buckets back into the gradients);
* **optimizer**: DDP's optimizer step over ``local``'s (the same update: this is noise).

Variants are timed interleaved (:mod:`.timing`): ``local`` (the same step, no DDP), ``ddp``
(DDP over ``"mpi4py"``, defaults untouched, as ``bench sgd``'s ddp-mpi4py), and for scale
``allreduce``: the backend's blocking all-reduce of a buffer the size of every gradient, alone.
``--bucket-view`` adds ``ddp-view``, DDP with ``gradient_as_bucket_view=True`` (no copies in and
out of the buckets). Figures are medians over the timed steps of the rank whose DDP step is
slowest. The last timed DDP step of each model is written as a Chrome trace
(``<out-dir>/ddp-step-<model>-n<R>.json``, one lane per rank, each rank's clock from its own start
of the step): open it in ui.perfetto.dev to see one step's forward, backward, buckets and update.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..args import add_command, choices_list, flag, nonneg_int, positive_int
from ..models import build_model
from ..replicas import replicate
from ..report import Output, markdown_table, save_results, write_json
from ..step import make_optimizer
from ..timing import WARMUP_STEPS, chrome_trace, time_interleaved
from .sgd import CLASSES, FEATURES, MODELS, OPTIMIZER

PARTS = (
    ("forward", "DDP's forward, over local's"),
    ("to_last_bucket", "backward until the last bucket's all-reduce starts, over local's whole backward"),
    ("after_last_start", "all-reduce after the last bucket started, until MPI finished it"),
    ("after_mpi", "after MPI: settling (DDP's division) and DDP's copies back into the gradients"),
    ("optimizer", "DDP's optimizer step, over local's"),
)


@dataclass(frozen=True)
class Flags(Output):
    models: list = flag(list(MODELS), "comma-separated models to time", choices_list(MODELS, "model"))
    batch_size: int = flag(64, "samples per rank per step", positive_int)
    rounds: int = flag(10, "interleaved blocks per variant", positive_int)
    steps_per_round: int = flag(10, "timed steps per block", positive_int)
    warmup: int = flag(WARMUP_STEPS, "discarded steps per variant", nonneg_int)
    bucket_view: bool = flag(False, "also time DDP with gradient_as_bucket_view=True (ddp-view)")
    seed: int = flag(0, "seed for models and data")


def _step_fn(model, optimizer, x, y, record: list, engine=None):
    """One SGD step with its clock readings (start, forward done, backward done, update done) and,
    with ``engine``, the progress threads' notes taken during it, appended to ``record``."""

    def step():
        notes = None
        if engine is not None:
            engine.trace = notes = []
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        if engine is not None:
            engine.trace = None
        record.append(((t0, t1, t2, t3), notes))

    return step


def works(notes) -> dict:
    """The progress threads' notes of one step as {work number: {event: time}} (the first note of each event)."""
    out: dict = {}
    for key, what, t in notes:
        out.setdefault(key, {}).setdefault(what, t)
    return out


def split(record, local_record) -> dict:
    """Median seconds of each part of :data:`PARTS` (and the steps, and the bucket count) over the
    steps in ``record`` (a DDP variant's), against ``local_record``'s medians."""
    med = statistics.median
    lf = med(t[1] - t[0] for (t, _) in local_record)
    lb = med(t[2] - t[1] for (t, _) in local_record)
    lo = med(t[3] - t[2] for (t, _) in local_record)
    parts = {k: [] for k, _ in PARTS}
    buckets = []
    for (t0, t1, t2, t3), notes in record:
        mine = [w for w in works(notes or []).values() if "start" in w and t1 <= w["start"] <= t2]
        parts["forward"].append(t1 - t0 - lf)
        parts["optimizer"].append(t3 - t2 - lo)
        buckets.append(len(mine))
        if not mine:
            continue
        last_start = max(w["start"] for w in mine)
        done = max(w.get("mpi-done", w.get("settled", t2)) for w in mine)
        parts["to_last_bucket"].append(last_start - t1 - lb)
        parts["after_last_start"].append(done - last_start)
        parts["after_mpi"].append(t2 - done)
    out = {k: (med(v) if v else float("nan")) for k, v in parts.items()}
    out["local_step"] = med(t[3] - t[0] for (t, _) in local_record)
    out["local_parts"] = (lf, lb, lo)
    out["step"] = med(t[3] - t[0] for (t, _) in record)
    out["buckets"] = med(buckets) if buckets else 0
    return out


def timeline(record) -> tuple[list, float]:
    """One DDP step (the last timed) as trace events ``(name, start, seconds)`` and its start time."""
    (t0, t1, t2, t3), notes = record[-1]
    events = [("forward", t0, t1 - t0), ("backward", t1, t2 - t1), ("optimizer", t2, t3 - t2)]
    # Works of this step only: the last one of the step before may still note that it settled.
    mine = [w for w in works(notes or []).values() if "start" in w]
    for i, w in enumerate(mine):
        start, done, settled = w["start"], w.get("mpi-done"), w.get("settled")
        if done is not None:
            events.append((f"bucket {i}: all-reduce (MPI)", start, done - start))
            if "waiter" in w:
                events.append((f"bucket {i}: waiter takes it", w["waiter"], 0.0))
        if settled is not None and done is not None:
            events.append((f"bucket {i}: settling", done, settled - done))
    return events, t0


def report(model: str, parts: dict, allreduce_s: float) -> str:
    ms = 1e3
    local = parts["local_step"]
    lf, lb, lo = (v * ms for v in parts["local_parts"])
    rows = [[f"local step (forward {lf:.2f}, backward {lb:.2f}, optimizer {lo:.2f})", f"{local * ms:.2f}", "1.000"]]
    for key, text in PARTS:
        v = parts[key]
        rows.append([text, f"{v * ms:.2f}", f"{v / local:.3f}"])
    step, n = parts["step"], parts["buckets"]
    rows.append([f"**DDP step** ({n:g} bucket{'' if n == 1 else 's'})", f"**{step * ms:.2f}**", f"{step / local:.3f}"])
    rows.append(["for scale: the backend's all-reduce of every gradient, alone", f"{allreduce_s * ms:.2f}", ""])
    return f"where DDP's step goes, {model}:\n" + markdown_table(["part", "ms", "x local step"], rows)


def bench_model(comm, group, name: str, args: Flags) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from ..comm.backends import progress

    engine = progress.engine()
    g = torch.Generator().manual_seed(args.seed + comm.rank)
    x = torch.randn(args.batch_size, FEATURES, generator=g)
    y = torch.randint(CLASSES, (args.batch_size,), generator=g)
    records, calls = {}, {}
    variants = ["local", "ddp"] + (["ddp-view"] if args.bucket_view else [])
    for v in variants:
        model = replicate(lambda: build_model(name, (FEATURES,), CLASSES), comm, args.seed)
        if v != "local":
            model = DistributedDataParallel(model, process_group=group, gradient_as_bucket_view=v == "ddp-view")
        records[v] = []
        calls[v] = _step_fn(model, make_optimizer(OPTIMIZER, model), x, y, records[v], engine if v != "local" else None)
    grads = torch.zeros(sum(p.numel() for p in model.parameters()))  # every gradient, in one buffer
    calls["allreduce"] = lambda: torch.distributed.all_reduce(grads, group=group)
    times = time_interleaved(comm, calls, args.steps_per_round * args.rounds, args.warmup, args.rounds)
    mine = {v: split(records[v][args.warmup :], records["local"][args.warmup :]) for v in variants[1:]}
    everyone = comm.allgather_obj(mine)
    slowest = max(everyone, key=lambda m: m["ddp"]["step"])
    events, t0 = timeline(records["ddp"])
    trace = chrome_trace(comm, events, t0)
    return {"model": name, "parts": slowest, "allreduce_s": times["allreduce"].max, "trace": trace}


def main(comm, args: Flags) -> int:
    from ..comm.backends.torch_dist import TorchDistComm
    from ..launch import pin_threads

    threads = pin_threads(comm.local_size)
    group = TorchDistComm("torch-mpi4py", comm).group
    results = [bench_model(comm, group, name, args) for name in args.models]
    if comm.is_root:
        print(
            f"torch DDP over the mpi4py backend, {comm.size} ranks x batch {args.batch_size}, {threads} torch "
            f"thread(s) per rank;\nmedians over {args.rounds} x {args.steps_per_round} steps of the rank whose "
            "DDP step is slowest, each part over the same part of the local step\n"
        )
        for r in results:
            for v, parts in r["parts"].items():
                label = r["model"] if v == "ddp" else f"{r['model']}, {v} (gradient_as_bucket_view=True)"
                print(report(label, parts, r["allreduce_s"]) + "\n")
            path = write_json(Path(args.out_dir) / f"ddp-step-{r['model']}-n{comm.size}.json", r["trace"])
            print(f"one DDP step of {r['model']}, every rank: {path}")
        payload = {
            "world_size": comm.size,
            "batch_size": args.batch_size,
            "threads": threads,
            "models": [{k: v for k, v in r.items() if k != "trace"} for r in results],
        }
        save_results(args, f"ddp-n{comm.size}", payload)
    return 0


def add_parser(kinds) -> None:
    """``mpi-sgd bench ddp``: register on the ``bench`` command's sub-parsers."""
    add_command(
        kinds,
        "ddp",
        Flags,
        _run,
        help="torch DDP over the mpi4py backend: where each step's added time goes, and one step's timeline",
        description=__doc__,
    )


def _run(args: Flags) -> int:
    from ..comm import init

    return main(init("mpi4py"), args)
