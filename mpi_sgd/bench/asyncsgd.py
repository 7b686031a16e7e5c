"""Asynchronous against synchronous SGD: the same problem, the same number of gradients.

    mpi-sgd bench async                                  # every scenario; starts its own mpiexec jobs
    mpi-sgd bench async --scenarios base --ranks 2,3     # some of them
    mpiexec -n 3 mpi-sgd bench async --scenarios base    # one scenario, on this world only

Each job trains the same initial model twice on its R ranks, from a barrier, in rounds that
alternate which goes first: synchronously (the trainer's step, bucketed all-reduce; R gradients
per step) and asynchronously (1 server, R - 1 workers; :mod:`mpi_sgd.paramserver`), each for the
same G gradients of B samples. Synchronous SGD takes one step of --lr per R gradients, so each
asynchronous gradient gets lr / R, as far per sample. The parameters are kept 20 times a run
and the loss over the whole dataset is computed afterwards, untimed: loss against wall time and
against samples seen. Scenarios:

* ``base`` at each of --ranks: SimpleNet on blobs, B = 32. At R = 2 asynchronous SGD has one
  worker where synchronous has two: it should lose on time.
* ``straggler`` (R = 3): the same, the last rank sleeping --straggler-ms after every gradient, as
  a slower machine would. Synchronous SGD waits for it every step; the other worker does not:
  asynchronous should win on time.
* ``comm`` (R = 3): the 784-1024-1024-10 MLP (7.5 MB of gradients) at B = 8: every gradient and
  every reply crosses the one server, where the all-reduce spreads the traffic over all ranks:
  asynchronous should lose on time.

One rank per core (``OMP_NUM_THREADS=1``); ranks talk through shared memory. On a machine with
fewer cores than ranks the ranks take turns on the cores, which slows whichever rank is off a
core at the moment: a straggler of its own kind, and one synchronous SGD waits for every step.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..args import UsageError, add_command, choices_list, flag, integer, positive_float, positive_int, rank_list
from ..launch import placement, run_job
from ..report import Output, markdown_table, new_figure, save_results, write_json

SCENARIOS = {  # name: (model, batch, evaluations, ranks or None for --ranks, straggler?)
    "base": ("simplenet", 32, 1200, None, False),
    "straggler": ("simplenet", 32, 600, 3, True),
    "comm": ("mlp", 8, 600, 3, False),
}
SHOULD = {"straggler": "async faster", "comm": "async slower"}
SNAPSHOTS = 20
HEADERS = ("scenario", "R", "sync s", "async s", "async/sync time", "sync loss", "async loss", "mean tau", "max tau")


@dataclass(frozen=True)
class Flags(Output):
    scenarios: list = flag(list(SCENARIOS), "comma-separated scenarios", choices_list(SCENARIOS, "scenario"))
    ranks: list = flag([2, 3, 4], "world sizes for 'base'; each >= 2", rank_list)
    evaluations: int | None = flag(None, "gradients per run (default: base 1200, others 600)", positive_int)
    lr: float = flag(0.1, "synchronous learning rate; async gets lr/R", positive_float)
    straggler_ms: float = flag(50.0, "the straggler's sleep per gradient", positive_float)
    rounds: int = flag(2, "runs of each, alternating which goes first", positive_int)
    seed: int = flag(0, "seed for the data and the initial model", integer)

    def __post_init__(self):
        if min(self.ranks) < 2:
            raise ValueError(f"--ranks: a parameter server needs a server and a worker, so R >= 2; got {self.ranks}")


# -- one job: this world, one scenario ----------------------------------------------------------
def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def run_sync(comm, model, dataset, lr, batch, evaluations, straggler_ms, seed) -> dict:
    from .. import data, gradsync
    from ..config import TrainConfig
    from ..step import make_optimizer, train_step

    plain_sgd = TrainConfig(optimizer="sgd", lr=lr, momentum=0.0)  # what each parameter server applies
    optimizer, sync = make_optimizer(plain_sgd, model), gradsync.make("bucketed", model, comm)
    steps, slow = evaluations // comm.size, straggler_ms / 1e3 if comm.rank == comm.size - 1 else 0.0
    every, kept = max(1, steps // SNAPSHOTS), [(0, 0.0, _flat(model))]
    comm.barrier()
    start, step, epoch = time.perf_counter(), 0, 0
    while step < steps:
        for idx in data.rank_batches(len(dataset), comm.rank, comm.size, batch, epoch, seed):
            train_step(model, optimizer, sync, dataset.x[idx], dataset.y[idx])  # the trainer's own step
            if slow:
                time.sleep(slow)  # before the next step's all-reduce, which the others wait in
            step += 1
            if comm.is_root and (step % every == 0 or step == steps):
                kept.append((step * comm.size, time.perf_counter() - start, _flat(model)))
            if step == steps:
                break
        epoch += 1
    return {"seconds": time.perf_counter() - start, "kept": kept}


def run_async(comm, model, dataset, lr, batch, evaluations, straggler_ms, seed) -> dict:
    from .. import paramserver

    cfg = paramserver.AsyncConfig(
        servers=1,
        lr=lr / comm.size,
        batch_size=batch,
        evaluations=evaluations,
        straggler_ms=straggler_ms,
        snapshot_every=max(1, evaluations // SNAPSHOTS),
        seed=seed,
    )
    result = paramserver.train(comm, model, dataset, cfg)
    return {
        "seconds": result.seconds,
        "kept": result.snapshots,
        "staleness": dict(result.staleness),
        "pushes_by_worker": dict(result.pushes_by_worker),
    }


def job(args) -> int:
    from .. import comm as mpicomm
    from .. import data
    from ..models import build_model
    from ..paramserver import mean_loss
    from ..replicas import replicate

    name = args.scenarios[0]
    model_name, batch, evaluations, _, slowed = SCENARIOS[name]
    comm = mpicomm.init()
    evaluations = (args.evaluations or evaluations) // comm.size * comm.size  # whole synchronous steps
    torch.set_num_threads(1)
    dataset = data.blobs(seed=args.seed)
    runs = {"sync": [], "async": []}
    for r in range(args.rounds):
        for mode in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
            model = replicate(
                lambda: build_model(model_name, tuple(dataset.x.shape[1:]), dataset.num_outputs), comm, args.seed
            )
            fn = run_sync if mode == "sync" else run_async
            run = fn(comm, model, dataset, args.lr, batch, evaluations, args.straggler_ms if slowed else 0.0, args.seed)
            if comm.is_root:  # the loss curve, computed now that the clock has stopped
                curve = []
                for seen, seconds, flat in run.pop("kept"):
                    torch.nn.utils.vector_to_parameters(flat, model.parameters())
                    curve.append((seconds, seen * batch, mean_loss(model.eval(), dataset)))
                runs[mode].append({**run, "curve": curve, "final_loss": curve[-1][2]})
    if comm.is_root:
        params = sum(p.numel() for p in model.parameters())
        write_json(
            Path(args.out_dir) / f"async-{name}-R{comm.size}.json",
            {
                "scenario": name,
                "ranks": comm.size,
                "model": model_name,
                "params": params,
                "batch": batch,
                "evaluations": evaluations,
                "lr": args.lr,
                "straggler_ms": args.straggler_ms if slowed else 0,
                "runs": runs,
            },
        )
    return 0


# -- the whole comparison: one job per scenario and R ---------------------------------------------
def summarize(result: dict) -> tuple:
    """One table row from a job's JSON: medians over its rounds."""
    sync, asyn = result["runs"]["sync"], result["runs"]["async"]
    t_sync = statistics.median(r["seconds"] for r in sync)
    t_async = statistics.median(r["seconds"] for r in asyn)
    taus: dict[int, int] = {}
    for run in asyn:
        for tau, n in run["staleness"].items():
            taus[int(tau)] = taus.get(int(tau), 0) + n
    mean_tau = sum(t * n for t, n in taus.items()) / max(1, sum(taus.values()))
    return (
        result["scenario"],
        result["ranks"],
        t_sync,
        t_async,
        t_async / t_sync,
        statistics.median(r["final_loss"] for r in sync),
        statistics.median(r["final_loss"] for r in asyn),
        round(mean_tau, 2),
        max(taus, default=0),
    )


def verdicts(rows) -> list[str]:
    lines = []
    for name, ranks, _, _, ratio, *_ in rows:
        expected = SHOULD.get(name) or ("async slower" if ranks == 2 else None)
        happened = "async faster" if ratio < 1 else "async slower"
        if expected:
            verdict = "as expected" if expected == happened else "not as the model expects, here"
            lines.append(f"{name} R={ranks}: expected {expected}; {verdict}: {happened} ({ratio:.2f}x the sync time)")
        else:
            lines.append(f"{name} R={ranks}: {happened} ({ratio:.2f}x the sync time)")
    return lines


def plot(results: list[dict], path: Path) -> None:
    fig, axes = new_figure(len(results), 2, figsize=(10, 2.6 * len(results)), squeeze=False)
    for (ax, bx), res in zip(axes, results, strict=True):
        for mode, color in (("sync", "tab:blue"), ("async", "tab:orange")):
            for i, run in enumerate(res["runs"][mode]):
                seconds, seen, loss = zip(*run["curve"], strict=True)
                label = mode if i == 0 else None
                ax.plot(seconds, loss, color=color, alpha=1 if i == 0 else 0.4, label=label)
                bx.plot(seen, loss, color=color, alpha=1 if i == 0 else 0.4, label=label)
        title = f"{res['scenario']}, R={res['ranks']}, {res['model']}, B={res['batch']}"
        ax.set(xlabel="wall time (s)", ylabel="loss", title=title)
        bx.set(xlabel="samples seen", ylabel="loss", title=title)
        for a in (ax, bx):
            a.grid(True, alpha=0.3)
            a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(args: Flags) -> int:
    if placement().size > 1:
        if len(args.scenarios) != 1:
            raise UsageError("under mpiexec, name one scenario: --scenarios base, straggler or comm")
        return job(args)
    jobs = [(s, r) for s in args.scenarios for r in ([SCENARIOS[s][3]] if SCENARIOS[s][3] else args.ranks)]
    passed = [
        "--rounds",
        str(args.rounds),
        "--lr",
        str(args.lr),
        "--straggler-ms",
        str(args.straggler_ms),
        "--seed",
        str(args.seed),
    ]
    if args.evaluations:
        passed += ["--evaluations", str(args.evaluations)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, ranks in jobs:
            run_job(
                ranks,
                "-m",
                "mpi_sgd.cli",
                "bench",
                "async",
                "--scenarios",
                name,
                "--out-dir",
                tmp,
                *passed,
                env={"OMP_NUM_THREADS": "1"},
                echo=True,
            )
            results.append(json.loads((Path(tmp) / f"async-{name}-R{ranks}.json").read_text()))
    rows = [summarize(r) for r in results]
    lines = verdicts(rows)
    print("\n" + markdown_table(HEADERS, rows) + "\n\n" + "\n".join(lines))
    save_results(
        args,
        "async",
        {"benchmark": "async", "rows": rows, "verdicts": lines, "jobs": results},
        lambda png: plot(results, png),
    )
    return 0


def add_parser(subparsers) -> None:
    add_command(
        subparsers,
        "async",
        Flags,
        main,
        help="asynchronous (parameter server) vs synchronous SGD, same gradients",
        description=__doc__,
    )
