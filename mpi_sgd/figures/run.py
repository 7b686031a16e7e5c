"""``mpi-sgd figures``: run the jobs each figure needs, draw it, and say where it came from.

    mpi-sgd figures --script examples/sync_sgd.py          # every figure, into docs/figures
    mpi-sgd figures zero-memory                            # one of them
    mpi-sgd figures staleness --redraw                     # draw again from the last run's data

Start it as one process: it launches its own MPI jobs (small but real runs: a benchmark with
fewer sizes, steps or repeats than its defaults), keeps their output under ``--work-dir``
(``<work-dir>/<figure>/``, with the provenance of the run), and writes ``<out-dir>/<figure>.svg``
or ``.png`` and its sidecar ``<figure>.json``: the command, the jobs it ran, the machine, the
date and the load (:mod:`.provenance`). ``--redraw`` skips the jobs and draws from the data and
provenance kept by the last run, for working on the drawing code.

A job that fails is reported with its output and its figure is left as it was; the command then
exits 1 once the other figures are drawn.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..args import UsageError, add_command, flag
from ..launch import JobFailed, mpiexec_command, placement
from ..timing import WARMUP_STEPS
from . import allreduce, goodput, pipeline, ring, speedup, staleness, timeline, zero
from .provenance import Provenance, save

ASYNC = ("--ranks", "4", "--evaluations", "600", "--rounds", "1")
GOODPUT = ("--seeds", "1", "--lrs", "0.03,0.1", "--ranks", "1,2,4", "--transports", "shm")
VALIDATE = ("--ranks", "1,2", "--repeats", "1", "--max-steps", "12")
SWEEP = ("--max-bytes", "16MiB", "--rounds", "5")  # both all-reduce sweeps
TRAIN = ("--model", "mlp", "--dataset", "blobs", "--batch-size", "64", "--bucket-mb", "1", "--max-steps", "16")


@dataclass(frozen=True)
class Job:
    """One command: under ``mpiexec -n ranks``, or as one process that starts its own jobs (ranks 0)."""

    ranks: int
    argv: tuple[str, ...]
    verdict: bool = False  # exit 1 is the benchmark's verdict on its figures, not a failed run

    def shown(self) -> str:
        """As a user would type it from the repository root, with no path of this machine."""
        words = ["mpi-sgd", *self.argv[2:]] if self.argv[:2] == ("-m", "mpi_sgd.cli") else ["python", *self.argv]
        launcher = ["mpiexec", "-n", str(self.ranks)] if self.ranks else []
        return " ".join([*launcher, *map(shlex.quote, words)])

    def run(self) -> None:
        if self.ranks:
            cmd, env = mpiexec_command(self.ranks, *self.argv)
        else:
            cmd, env = [sys.executable, *self.argv], dict(os.environ)
        print(f"$ {self.shown()}", flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode not in ((0, 1) if self.verdict else (0,)):
            raise JobFailed(cmd, done.returncode, done.stdout + done.stderr)


def _bench(*argv: str, ranks: int = 0, verdict: bool = False) -> Job:
    return Job(ranks, ("-m", "mpi_sgd.cli", "bench", *argv, "--no-plot"), verdict=verdict)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@dataclass(frozen=True)
class Figure:
    """A figure: its file, the jobs that measure it (given its work folder) and how to draw it."""

    name: str
    suffix: str
    jobs: Callable[[Path, str | None], list[Job]]  # (work folder, training script) -> jobs
    draw: Callable[[Path], object]

    @property
    def file(self) -> str:
        return self.name + self.suffix


# Sizes of the runs: a few minutes in all on a two-core machine, each still a real run of the
# benchmark, at a world size that shows the idea (4 ranks for the ring's steps, 3 pipeline stages).
FIGURES = {
    f.name: f
    for f in (
        Figure(
            "ring-allreduce",
            ".svg",
            lambda w, script: [Job(4, ("-m", "mpi_sgd.figures.ring", "--out", str(w / "ring.json")))],
            lambda w: ring.draw(_json(w / "ring.json")),
        ),
        Figure(
            "timeline-bucketed",
            ".png",
            lambda w, script: [Job(2, (script, *TRAIN, "--no-progress", "--timeline", str(w / "trace.json")))],
            lambda w: timeline.draw(_json(w / "trace.json"), WARMUP_STEPS)[0],
        ),
        Figure(
            "allreduce-sizes",
            ".png",
            lambda w, script: [
                _bench("allreduce", "--min-bytes", "256", *SWEEP, "--iterations", "50", "--out-dir", str(w), ranks=2),
                _bench("shm", "--pool", "64MiB", *SWEEP, "--iterations", "30", "--out-dir", str(w), ranks=2),
            ],
            lambda w: allreduce.draw(_json(w / "allreduce-n2.json"), _json(w / "shm-n2.json")),
        ),
        Figure(
            "zero-memory",
            ".png",
            lambda w, script: [
                _bench("zero", "--optimizer", "adam", "--steps", "1", "--rounds", "1", "--out-dir", str(w), ranks=4)
            ],
            lambda w: zero.draw(_json(w / "zero-n4.json"), "adam"),
        ),
        Figure(
            "pipeline-schedules",
            ".png",
            lambda w, script: [
                _bench("pipeline", "--steps", "2", "--rounds", "2", "--timeline-m", "4", "--out-dir", str(w), ranks=3)
            ],
            lambda w: pipeline.draw(
                _json(w / "pipeline-n3.json"),
                {s: _json(w / f"pipeline-timeline-{s}-n3.json") for s in ("gpipe", "1f1b")},
            ),
        ),
        Figure(
            "staleness",
            ".png",
            lambda w, script: [_bench("async", "--scenarios", "base,straggler", *ASYNC, "--out-dir", str(w))],
            lambda w: staleness.draw(_json(w / "async.json")),
        ),
        Figure(
            "time-to-target",
            ".png",
            lambda w, script: [_bench("goodput", *GOODPUT, "--out-dir", str(w))],  # one process: it starts its jobs
            lambda w: goodput.draw(_json(w / "goodput.json")),
        ),
        Figure(
            "speedup",
            ".png",
            # validate exits 1 when the model calls the wrong side of break-even: the figure shows it
            lambda w, script: [_bench("validate", *VALIDATE, "--out-dir", str(w), verdict=True)],
            lambda w: speedup.draw(_json(w / "validate.json")),
        ),
    )
}


def draw(figure: Figure, work: Path, out: Path) -> Path:
    """Draw ``figure`` from its work folder with the provenance kept there; returns the file."""
    provenance = Provenance.from_record(_json(work / "provenance.json"))
    return save(figure.draw(work), out / figure.file, provenance)


def make(figure: Figure, work: Path, out: Path, command: str, script: str | None) -> Path:
    """Run ``figure``'s jobs into an emptied ``work``, keep their provenance there, then draw it."""
    # Emptied first: a job that fails to write its output must not leave the last run's to be drawn.
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    jobs = figure.jobs(work, script)
    provenance = Provenance(figure.name, command, [j.shown() for j in jobs])
    for job in jobs:
        job.run()
    provenance.finish()
    (work / "provenance.json").write_text(json.dumps(provenance.record(), indent=2) + "\n")
    return draw(figure, work, out)


def command_line(name: str, args) -> str:
    """The one command that makes this figure again, as it was typed (paths relative, as given)."""
    words = ["mpi-sgd", "figures", name]
    if name == "timeline-bucketed":
        words += ["--script", args.script]
    if args.out_dir != DEFAULT_OUT:
        words += ["--out-dir", args.out_dir]
    return " ".join(map(shlex.quote, words))


def finished(work: Path) -> bool:
    """Whether a run of the figure whose work folder this is ended and left its provenance."""
    return (work / "provenance.json").is_file()


def main(args) -> int:
    names = args.names or list(FIGURES)
    if "timeline-bucketed" in names and not args.redraw and not args.script:
        raise UsageError("timeline-bucketed traces a training script: give --script, e.g. sync_sgd.py")
    if args.redraw and args.script:
        raise UsageError("--redraw runs no job, so --script would do nothing: leave one out")
    if args.script and not Path(args.script).is_file():
        raise UsageError(f"--script {args.script}: no such file")
    for name in names if args.redraw else ():
        if not finished(Path(args.work_dir) / name):
            raise UsageError(f"--redraw: no finished run of {name} in {args.work_dir}; run it without --redraw first")
    if placement().size > 1:
        raise UsageError("run as one process (mpi-sgd figures): it launches its own mpiexec jobs")
    out, failed = Path(args.out_dir), []
    for name in names:
        figure, work = FIGURES[name], Path(args.work_dir) / name
        print(f"== {figure.file}", flush=True)
        try:
            path = (
                draw(figure, work, out)
                if args.redraw
                else make(figure, work, out, command_line(name, args), args.script)
            )
        except (JobFailed, ValueError, KeyError, OSError) as e:  # a failed job, or data that cannot be drawn
            print(f"{figure.file}: not drawn: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            failed.append(name)
            continue
        print(f"wrote {path} and {path.with_suffix('.json')}", flush=True)
    if failed:
        print(f"not drawn: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


DEFAULT_OUT = "docs/figures"


def figure_name(text: str) -> str:
    if text not in FIGURES:
        raise argparse.ArgumentTypeError(f"unknown figure {text!r}; choose from {', '.join(FIGURES)}")
    return text


@dataclass(frozen=True)
class Flags:
    names: list = flag(
        [],
        f"figures to make, any of: {', '.join(FIGURES)} (default all)",
        figure_name,
        metavar="FIGURE",
        positional=True,
    )
    out_dir: str = flag(DEFAULT_OUT, "where the figures and sidecars go")
    work_dir: str = flag("results/figures", "where the jobs' own output and each run's provenance are kept")
    script: str | None = flag(None, "the training script timeline-bucketed traces, e.g. sync_sgd.py")
    redraw: bool = flag(False, "draw from the last run's data in --work-dir; run no job")


def add_parser(subparsers) -> None:
    add_command(
        subparsers,
        "figures",
        Flags,
        main,
        help="run small real jobs and draw the docs' figures from them (one process)",
        description=__doc__,
    )
