"""``mpi-sgd figures``: which jobs each figure runs, what it says it ran, and its refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_sgd.figures import run
from mpi_sgd.figures.provenance import Provenance
from tests.helpers import prints_usage_errors, standalone_env, textbook_ring

# The file names the docs pages refer to.
FILES = {
    "ring-allreduce.svg",
    "timeline-bucketed.png",
    "time-to-target.png",
    "allreduce-sizes.png",
    "zero-memory.png",
    "pipeline-schedules.png",
    "staleness.png",
    "speedup.png",
}


def test_the_figures_are_the_ones_the_docs_name():
    assert {f.file for f in run.FIGURES.values()} == FILES


def test_every_job_is_shown_as_a_user_types_it():
    work = Path("results/figures")
    for figure in run.FIGURES.values():
        for job in figure.jobs(work / figure.name, "sync_sgd.py"):
            shown = job.shown()
            assert shown.startswith(("mpiexec -n", "mpi-sgd bench")), shown
            # no path of this machine: no interpreter, launcher or absolute folder
            assert sys.executable not in shown and " /" not in shown, shown
            assert str(work / figure.name) in shown, shown  # its output lands in its own work folder


def test_jobs_run_the_benchmark_as_shown():
    (job,) = run.FIGURES["zero-memory"].jobs(Path("w"), None)
    assert job.ranks == 4 and job.argv[:4] == ("-m", "mpi_sgd.cli", "bench", "zero")
    assert job.shown() == "mpiexec -n 4 mpi-sgd bench zero " + " ".join(job.argv[4:])
    (job,) = run.FIGURES["timeline-bucketed"].jobs(Path("w"), "my_train.py")
    assert job.ranks == 2 and job.argv[0] == "my_train.py" and "--timeline" in job.argv
    assert job.shown().startswith("mpiexec -n 2 python my_train.py --model mlp")
    (job,) = run.FIGURES["speedup"].jobs(Path("w"), None)
    assert job.ranks == 0 and job.shown().startswith("mpi-sgd bench validate")  # one process: it launches its own


class _Args:
    script, out_dir = "sync_sgd.py", run.DEFAULT_OUT


def test_the_one_command_of_each_figure():
    assert run.command_line("zero-memory", _Args()) == "mpi-sgd figures zero-memory"
    assert run.command_line("timeline-bucketed", _Args()) == "mpi-sgd figures timeline-bucketed --script sync_sgd.py"
    other = _Args()
    other.out_dir = "elsewhere"
    assert run.command_line("staleness", other) == "mpi-sgd figures staleness --out-dir elsewhere"


def test_a_figure_is_drawn_from_its_work_folder_with_the_provenance_kept_there(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "ring.json").write_text(json.dumps(textbook_ring(3)))
    prov = Provenance("ring-allreduce", "mpi-sgd figures ring-allreduce", ["mpiexec -n 4 python -m x"])
    (work / "provenance.json").write_text(json.dumps(prov.record()))
    path = run.draw(run.FIGURES["ring-allreduce"], work, out)
    assert path == out / "ring-allreduce.svg" and path.is_file()
    side = json.loads((out / "ring-allreduce.json").read_text())
    assert side["jobs"] == prov.jobs and side["date"] == prov.date


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**standalone_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-m", "mpi_sgd.cli", "figures", *argv], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_redraw_runs_no_job_and_refuses_without_a_run(tmp_path):
    work = tmp_path / "results" / "figures" / "ring-allreduce"
    work.mkdir(parents=True)
    (work / "ring.json").write_text(json.dumps(textbook_ring(2)))
    (work / "provenance.json").write_text(json.dumps(Provenance("ring-allreduce", "mpi-sgd figures x").record()))
    done = _cli("ring-allreduce", "--redraw", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "$ " not in done.stdout  # no job started
    assert (tmp_path / "docs" / "figures" / "ring-allreduce.svg").is_file()
    done = _cli("staleness", "--redraw", cwd=tmp_path)
    assert done.returncode == 2 and "no finished run of staleness" in done.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["timeline-bucketed"], "give --script"),
        ([], "give --script"),  # every figure, the timeline among them
        (["zero-memory", "--script", "no_such_file.py"], "no such file"),
        (["ring-allreduce", "--redraw", "--script", os.devnull], "--script would do nothing"),
        (["no-such-figure"], "unknown figure"),
    ],
)
def test_bad_requests_exit_2_before_any_job(argv, message, tmp_path, capsys, monkeypatch):
    from mpi_sgd.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["figures", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert (message in err) if prints_usage_errors() else err == ""  # rank 0 speaks for all
    assert not list(tmp_path.iterdir())  # nothing launched, nothing written


def test_a_benchmark_verdict_is_drawn_but_a_failed_run_is_not():
    assert [j.verdict for f in run.FIGURES.values() for j in f.jobs(Path("w"), "s.py")].count(True) == 1
    (validate,) = run.FIGURES["speedup"].jobs(Path("w"), None)
    assert validate.verdict  # bench validate exits 1 for "the model called the wrong side": still a figure
    run.Job(0, ("-c", "raise SystemExit(1)"), verdict=True).run()
    for job in (run.Job(0, ("-c", "raise SystemExit(1)")), run.Job(0, ("-c", "raise SystemExit(2)"), verdict=True)):
        with pytest.raises(run.JobFailed):
            job.run()


def _toy(code: str) -> run.Figure:
    """A figure whose one job runs ``code`` (given the work folder as argv[1]) and whose drawing
    plots the numbers that job wrote to data.json."""
    from mpi_sgd.report import new_figure

    def draw(work: Path):
        fig, ax = new_figure()
        ax.plot(json.loads((work / "data.json").read_text()))
        return fig

    return run.Figure("toy", ".png", lambda w, script: [run.Job(0, ("-c", code, str(w)))], draw)


def test_make_runs_the_jobs_then_draws_what_they_wrote(tmp_path):
    write = (
        "import json, sys, pathlib, time; time.sleep(0.2); "
        "(pathlib.Path(sys.argv[1]) / 'data.json').write_text(json.dumps([3, 1, 2]))"
    )
    path = run.make(_toy(write), tmp_path / "work", tmp_path / "out", "mpi-sgd figures toy", None)
    assert path == tmp_path / "out" / "toy.png" and path.is_file()
    side = json.loads(path.with_suffix(".json").read_text())
    assert side["command"] == "mpi-sgd figures toy" and side["jobs"][0].startswith("python -c ")
    assert side["seconds"] >= 0.2 and side["load_after"] == side["load_after"]  # read after the jobs (not nan)
    assert json.loads((tmp_path / "work" / "provenance.json").read_text())["jobs"] == side["jobs"]  # for --redraw


def test_a_failed_job_draws_nothing_not_even_the_last_runs_data(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.json").write_text("[1, 2]")  # a previous run's output
    with pytest.raises(run.JobFailed):
        run.make(_toy("raise SystemExit(3)"), work, tmp_path / "out", "mpi-sgd figures toy", None)
    assert not (work / "data.json").exists() and not (tmp_path / "out").exists()
