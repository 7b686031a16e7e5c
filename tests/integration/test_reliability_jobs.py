"""Reliability of real jobs: examples/sync_sgd.py under mpiexec, as users launch it.

Non-finite training stops every rank with one message and a hint; ranks started with other flags
are refused before training (an MPMD launch, ``mpiexec -n 1 ... : -n 1 ...``); a job killed in
mid-run resumes with ``--resume auto`` to parameters bit-identical to an uninterrupted run. The
kill drills at every step of a save run without MPI in tests/unit/test_checkpoint_dirs.py; a
second job in one checkpoint directory is tests/integration/test_checkpoint_jobs.py, the one-line
refusals of bad input tests/integration/test_sync_sgd_script.py.
"""

from __future__ import annotations

import re
import subprocess
import sys

from mpi_sgd import jobdrills
from mpi_sgd.checkpoint import drill
from mpi_sgd.launch import mpiexec_command
from mpi_sgd.launchers import statuses_after_signal, stop_signal

from .conftest import EXAMPLES, ROOT, own_lines, run_mpi

SCRIPT = str(EXAMPLES / "sync_sgd.py")
ENV = {"OMP_NUM_THREADS": "1"}


def test_lr_1e6_stops_every_rank_at_one_step_with_one_message():
    out = run_mpi(2, SCRIPT, "--lr", "1e6", "--epochs", "2", env=ENV, check=False)
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    found = re.findall(r"training diverged: loss (?:nan|inf) in step (\d+) \(epoch 0\) on ranks? [\d, ]+;", out.stderr)
    assert len(found) == 1, out.stderr  # printed once, by the root, for every rank
    assert re.search(r"; try a lower --lr than 1000000\.0$", own_lines(out.stderr)[0]), out.stderr  # the hint
    assert "Traceback" not in out.stderr and "loss nan" not in out.stdout and "epoch   0" not in out.stdout


def test_a_rank_started_with_other_flags_is_refused_before_training():
    cmd, env = mpiexec_command(1, SCRIPT, "--epochs", "2", "--lr", "0.05")
    cmd += [":", "-n", "1", sys.executable, SCRIPT, "--epochs", "3", "--lr", "0.1"]
    out = subprocess.run(cmd, cwd=ROOT, env={**env, **ENV}, capture_output=True, text=True, timeout=150)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = own_lines(out.stderr)
    assert len(lines) == 1, out.stderr
    assert "--epochs: 2 on rank 0; 3 on rank 1" in lines[0] and "--lr: 0.05 on rank 0; 0.1 on rank 1" in lines[0]
    assert "epoch" not in out.stdout


def test_kill_then_resume_auto_is_bit_identical():
    cmd, env = mpiexec_command(2, SCRIPT, "--epochs", "4", "--no-progress", "--batch-size", "64")
    ok, seconds, message = drill.kill_and_resume(cmd, env={**env, **ENV}, timeout=150)
    assert ok, message


def test_sigterm_to_mpiexec_saves_the_step_and_resume_auto_goes_on(tmp_path):
    # As Slurm ends a job at its time limit: SIGTERM to the launcher, which passes it to the ranks
    # (Open MPI's kills them on SIGTERM and passes SIGUSR1 on: stop_signal picks the one that works).
    ck = str(tmp_path / "ck")
    cmd, env = mpiexec_command(2, SCRIPT, "--checkpoint", ck, "--epochs", "400", "--batch-size", "8", "--no-progress")
    job = subprocess.Popen(cmd, cwd=ROOT, env={**env, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in job.stdout:
        if line.startswith("epoch   1"):
            break
    signal = stop_signal(cmd[0])
    job.send_signal(signal)
    out, err = job.communicate(timeout=60)
    assert job.returncode in statuses_after_signal(cmd[0], 75), (job.returncode, err[-2000:])  # or 0 under Hydra 4.0
    said = re.findall(rf"^saved step (\d+) to (.+) on {signal.name}; resume with --resume auto$", out, re.M)
    assert len(said) == 1 and said[0][1] == ck, out[-2000:]
    assert "Traceback" not in err and "BAD TERMINATION" not in out + err
    step = int(said[0][0])
    again = run_mpi(2, SCRIPT, "--checkpoint", ck, "--resume", "auto", "--epochs", "3", "--batch-size", "8", env=ENV)
    assert re.search(rf"^resuming from {re.escape(ck)}/step-0*{step} at step {step}$", again.stdout, re.M), again.stdout


def test_a_job_killed_outright_leaves_nothing_in_dev_shm():
    # The launcher and every rank SIGKILLed at once (a scheduler's cleanup, a harness's timeout):
    # no MPI code runs to remove its files. MPICH's segment lost its name once every rank mapped
    # it; the rest (Open MPI's) no process maps any more, and the next job's clean removes it.
    cmd, env = mpiexec_command(2, "-c", jobdrills.WAITS)
    ok, _, message = jobdrills.killed_outright(cmd, env={**env, **ENV})
    assert ok, message


def test_ctrl_c_ends_the_job_in_one_line_without_tracebacks():
    # Hydra passes SIGINT on to every rank, which would each print a KeyboardInterrupt traceback:
    # rank 0 says one line and all exit 130. Open MPI's launcher ends the ranks itself, silently.
    cmd, env = mpiexec_command(2, SCRIPT, "--epochs", "400", "--batch-size", "8", "--no-progress")
    ok, seconds, message = jobdrills.ctrl_c(cmd, env={**env, **ENV})
    assert ok and seconds < 10, (seconds, message)


def test_sigint_to_one_rank_alone_names_it_and_ends_the_job():
    # kill -INT to rank 1 only: not the job's Ctrl-C. Rank 1 names itself and ends the job; rank 0
    # must not report a failure of its own (its collective losing a peer) with a traceback.
    cmd, env = mpiexec_command(2, SCRIPT, "--epochs", "400", "--batch-size", "8", "--no-progress")
    ok, seconds, message = jobdrills.sigint_to_one_rank(cmd, env={**env, **ENV})
    assert ok and seconds < 10, (seconds, message)
