"""``mpi-sgd bench goodput``: is the time-to-target model right? Steps and seconds to a target, predicted and measured.

    mpi-sgd bench goodput                       # start it as one process: it launches its own jobs
    mpi-sgd bench goodput --seeds 1 --multiples 1,4,16 --ranks 1,2   # a quicker look

Four measurements, one command (the model: :mod:`mpi_sgd.perfmodel.goodput`):

1. **Steps to the target against the global batch.** For each global batch G = B·m (``--batch``
   B, ``--multiples`` m), train to ``--target-val-loss`` over ``--seeds`` seeds, at every rate of
   ``--lrs`` (the tuned run is the best of them, per batch) and at the rule's rate (``--rule``
   scaling from the best rate at batch B). These runs are one process at batch G: R ranks at batch
   B take exactly the steps of one process at batch R·B (the trainer's equivalence tests check it
   to 1e-12), so they are the R-rank runs, minus the waiting.
2. **S_min and B_noise fitted** to the tuned medians (least squares of steps on 1/G), the steps each
   batch is predicted to need beside those it took; and the noise scale the trainer measured in one
   small-batch run (``--noise-scale`` with micro-batches), for comparison with the fitted one.
3. **Real jobs to the target**: ``mpiexec -n R`` at per-rank batch B for each of ``--ranks``, over
   TCP as between nodes and over shared memory (``--transports``), each at the tuned rate of its
   global batch, ``--job-repeats`` times (the run of median time is reported); time to the target
   measured, held-out scoring left out (``eval_s``). Scoring
   every ``--eval-every`` steps (in the sweep too), so steps to the target are its multiples: a
   score every step would cost more than the step itself for a model this small.
4. **The prediction** of those times: S(R·B) from the fit times T_step(R) = T_comp(R) + T_sync(R),
   both from :mod:`mpi_sgd.calibrate` on the same transport: T_comp timed with R ranks computing at
   once (ranks sharing cores and memory slow each other down, beyond the cores they take turns),
   T_sync from α, β, γ calibrated at R = 2 and the ring formula. T_comp is the step of the jobs'
   own strategy (``STRATEGY``). A second table splits each job's measured step the same way: the
   slowest rank's compute, the all-reduce itself, and the rest, which the model leaves out (ranks
   waiting for one another, the loop's own bookkeeping).

The project's targets are printed under the tables (:mod:`.goodput_report`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..args import UsageError, add_command, choices_list, flag, positive_float, positive_floats, positive_int, rank_list
from ..launch import placement
from ..report import Output, save_results
from . import goodput_report as report

DATASET, MODEL = "digits", "ffnet"  # small enough that the whole command takes minutes on two cores
# The jobs' strategy, which the calibration times T_comp with too: the step the model predicts is the
# step the job runs (bucketed gradients are copied into buckets as backward makes them; flat ones
# are not), the default of sync_sgd.py.
STRATEGY = "bucketed"
FFNET_LAYERS = (64, 64, 64, 10)  # what ffnet is for digits, as the calibration's MLP times it


@dataclass(frozen=True)
class Flags(Output):
    batch: int = flag(8, "per-rank batch B (the smallest global batch)", positive_int)
    multiples: list = flag([1, 2, 4, 8, 16, 32, 64], "global batches B*m for these m", rank_list)
    seeds: int = flag(3, "seeds per batch and rate (the medians are over them)", positive_int)
    lrs: list = flag([0.01, 0.03, 0.1, 0.3], "learning rates tried at every batch (momentum 0.9)", positive_floats)
    rule: str = flag("sqrt", "the scaling rule also run, from the best rate at batch B", choices=("linear", "sqrt"))
    target_val_loss: float = flag(0.3, "the target: held-out loss at most this", positive_float)
    max_steps: int = flag(800, "a run that has not reached the target by then has missed it", positive_int)
    eval_every: int = flag(
        5, "score the held-out set every this many steps (steps to the target are multiples)", positive_int
    )
    ranks: list = flag([1, 2, 4], "R of the real jobs to the target", rank_list)
    transports: list = flag(["tcp", "shm"], "tcp (as between nodes) and/or shm", choices_list(("tcp", "shm")))
    job_repeats: int = flag(3, "runs of each real job; the one of median time is reported", positive_int)

    def __post_init__(self):
        if 1 not in self.ranks or 1 not in self.multiples:
            raise ValueError("--ranks and --multiples must include 1: the baseline")
        if 2 not in self.ranks:
            raise ValueError("--ranks must include 2: the network is calibrated at two ranks")


def add_parser(subparsers) -> None:
    add_command(
        subparsers,
        "goodput",
        Flags,
        run,
        help="steps and time to a target against the batch and R: the time-to-target model checked",
        description=__doc__,
    )


# -- 1. steps to the target, in this process ------------------------------------------------------
def train_to_target(batch: int, lr: float, seed: int, args, **extra) -> tuple[int | None, object]:
    """Steps one process at ``batch`` needs to the target (None: not within ``--max-steps``), and its trainer."""
    from ..comm.backends.local import LocalComm
    from ..config import TrainConfig
    from ..data import prepare
    from ..trainer import Trainer

    cfg = TrainConfig(
        model=MODEL,
        dataset=DATASET,
        batch_size=batch,
        lr=lr,
        momentum=0.9,
        seed=seed,
        epochs=10**4,
        max_steps=args.max_steps,
        target_val_loss=args.target_val_loss,
        eval_every=args.eval_every,
        check_every=0,
        progress=False,
        **extra,
    )
    train, val = prepare(DATASET, seed, cfg.val_fraction)
    with contextlib.redirect_stdout(io.StringIO()):  # each run's own lines: the table says it all
        trainer = Trainer.from_config(cfg, train, LocalComm(), val=val)
        try:
            trainer.train()
        except Exception as e:  # a rate too high for this batch diverges: the target is missed
            if type(e).__name__ != "TrainingDiverged":
                raise
            return None, trainer
    record = trainer.time_to_target()
    return (record["step"] if record["reached"] else None), trainer


def median_steps(runs: list[int | None]) -> float | None:
    """The median over seeds, a missed run counting as infinitely many steps (None: the median missed)."""
    middle = statistics.median(float("inf") if s is None else float(s) for s in runs)
    return None if middle == float("inf") else middle


def sweep(args) -> list[dict]:
    """Every global batch at every rate and seed, then at the rule's rate: one row per batch."""
    rows = []
    for m in args.multiples:
        g = args.batch * m
        per_lr = {lr: [train_to_target(g, lr, s, args)[0] for s in range(args.seeds)] for lr in args.lrs}
        best_lr = min(args.lrs, key=lambda lr: (median_steps(per_lr[lr]) or float("inf"), lr))
        rows.append({"batch": g, "runs": {str(k): v for k, v in per_lr.items()}, "lr": best_lr})
        rows[-1]["steps"] = median_steps(per_lr[best_lr])
        print(f"global batch {g:4d}: tuned lr {best_lr:g}, median steps {rows[-1]['steps']}", flush=True)
    base = rows[0]["lr"]
    for row in rows:
        k = row["batch"] / args.batch
        row["rule_lr"] = base * (k if args.rule == "linear" else k**0.5)
        row["rule_runs"] = [train_to_target(row["batch"], row["rule_lr"], s, args)[0] for s in range(args.seeds)]
        row["rule_steps"] = median_steps(row["rule_runs"])
    return rows


def noise_run(args, rows: list[dict]) -> dict:
    """B_noise as the trainer measures it: one process, micro-batches of B in a step of 4B."""
    row = next((r for r in rows if r["batch"] == 4 * args.batch), rows[0])
    _, trainer = train_to_target(4 * args.batch, row["lr"], 0, args, noise_scale=True, grad_accum=4)
    values = [e["b_noise"] for e in trainer.history if e.get("b_noise") is not None]
    return {"b_noise": statistics.fmean(values) if values else None, "per_epoch": values, "batch": 4 * args.batch}


# -- 3. real jobs ---------------------------------------------------------------------------------
def job(ranks: int, transport: str, lr: float, args, repeat: int = 0) -> dict:
    from .validate import _run

    path = Path(args.out_dir) / f"goodput-job-n{ranks}-{transport}-{repeat}.json"
    argv = ("--model", MODEL, "--dataset", DATASET, "--strategy", STRATEGY, "--batch-size", str(args.batch))
    argv += ("--lr", str(lr), "--target-val-loss", str(args.target_val_loss), "--eval-every", str(args.eval_every))
    argv += ("--max-steps", str(args.max_steps), "--epochs", str(10**4), "--check-every", "0", "--no-progress")
    _run(ranks, transport, "-m", "mpi_sgd.bench.validate", *argv, "--metrics-json", str(path))
    return json.loads(path.read_text())


def median_run(runs: list[dict]) -> tuple[dict, list[float | None]]:
    """The run of median time to the target (a missed target counting as the longest), and every
    run's training seconds. A job of this model is over in moments, so one rank descheduled for a
    while on a shared host moves a single run's time by a large part; the median of a few is the
    run the model should be held to."""
    seconds = [report.training_seconds(m["time_to_target"]) for m in runs]
    order = sorted(range(len(runs)), key=lambda i: (seconds[i] is None, seconds[i] or 0.0))
    return runs[order[(len(order) - 1) // 2]], seconds


def step_parts(t_comp: list[list[float]], t_sync: list[list[float]]) -> dict:
    """The job's step as the model splits it, from every rank's per-step times: the compute of the
    slowest rank (its median, as the calibration takes T_comp) and the all-reduce itself, the
    median per step of the shortest wait in it (the rank that came last waited for no one)."""
    compute = max(statistics.median(rank) for rank in t_comp)
    allreduce = statistics.median(min(step) for step in zip(*t_sync, strict=True)) if t_sync[0] else 0.0
    return {"compute_measured": compute, "allreduce_measured": allreduce}


def calibrations(transport: str, args) -> dict:
    """T_comp at each R (the ranks computing at once, as they will in the job) and α, β, γ at R = 2."""
    from types import SimpleNamespace

    from .validate import calibrate

    where = SimpleNamespace(out_dir=Path(args.out_dir), max_bytes=1 << 20, transport=transport)
    return {r: calibrate(args.batch, r, where, layers=FFNET_LAYERS, strategy=STRATEGY) for r in args.ranks}


def jobs(args, rows: list[dict]) -> list[dict]:
    """Each R and transport: the measured time to the target and its inputs to the prediction."""
    from ..models import build_model

    lr_at = {r["batch"]: r["lr"] for r in rows}
    grad_bytes = 4 * sum(p.numel() for p in build_model(MODEL, (64,), 10).parameters())  # digits: 64 in, 10 out
    out = []
    for transport in args.transports:
        cals = calibrations(transport, args)
        net = cals[2].network
        for r in args.ranks:
            lr = lr_at.get(r * args.batch) or rows[-1]["lr"]
            metrics, seconds = median_run([job(r, transport, lr, args, i) for i in range(args.job_repeats)])
            record = metrics["time_to_target"]
            out.append(
                {
                    "ranks": r,
                    "transport": transport,
                    "lr": lr,
                    "record": record,
                    "repeats": seconds,
                    "t_comp": metrics["summary"]["t_comp"],
                    "t_sync": metrics["summary"]["t_sync"],
                    **step_parts(metrics["t_comp"], metrics["t_sync"]),
                    "t_comp_calibrated": cals[r].step.seconds,
                    "grad_bytes": grad_bytes,
                    "network": {"alpha": net.alpha, "beta": net.beta, "gamma": net.gamma},
                }
            )
            print(f"R = {r} over {transport}: {report.job_line(out[-1])}", flush=True)
    return out


def run(args: Flags) -> int:
    if placement().size > 1:
        raise UsageError("start it as one process (mpi-sgd bench goodput): it launches its own mpiexec jobs")
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    rows = sweep(args)
    noise = noise_run(args, rows)
    runs = jobs(args, rows)
    result = report.assemble(args, rows, noise, runs, os.cpu_count() or 1)
    for line in report.render(result):
        print(line)
    save_results(args, "goodput", result, lambda png: report.plot(result, png))
    return 0
