"""Drills on a whole job from outside: what a user at a terminal, or a scheduler, does to it.

Each takes the command that starts a training job (``mpiexec -n 2 python sync_sgd.py ...``, from
:func:`mpi_sgd.launch.mpiexec_command`) and returns ``(ok, seconds, message)``, as the checkpoint
drills (:mod:`mpi_sgd.checkpoint.drill`) do; ``mpi-sgd faults`` shows them as rows.

* :func:`ctrl_c`: SIGINT to the launcher once the job trains. Hydra passes it on to every rank:
  one line from rank 0, status 130, no traceback. Open MPI's launcher ends the ranks itself.
* :func:`sigint_to_one_rank`: SIGINT to rank 1 alone (``kill -INT``), not the job's Ctrl-C: rank 1
  names itself in one line and ends the job, status 130; the others do not blame themselves.
* :func:`killed_outright`: SIGKILL to the launcher and every rank at once, so that no MPI code
  runs to clean up: nothing of the job may stay in /dev/shm, nor Open MPI's launcher session in
  the temporary directory, once the next job's clean has run (:mod:`mpi_sgd.cluster.residue`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from .cluster import residue
from .launchers import launcher_family, signal_and_wait, statuses_after_signal

# A rank that notes its pid once MPI is up, then waits: killed_outright's job. A file per rank, not
# a line: the launcher may splice two ranks' lines into one ("readyready 8033").
WAITS = """import os, time
from mpi_sgd import comm
comm.init(stall_timeout=0).barrier()
open(os.path.join(os.environ["MPI_SGD_DRILL_DIR"], str(os.getpid())), "w").close()
time.sleep(600)
"""


def _until_training(job: subprocess.Popen) -> None:
    for line in job.stdout:
        if line.startswith("epoch"):  # an epoch done: the job trains
            return


def ctrl_c(command: list[str], env: dict | None = None, timeout: float = 60) -> tuple[bool, float, str]:
    env = {**os.environ, **(env or {})}
    # SIGINT as at a terminal, not ignored as in a background job of a shell without job control
    default = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    job = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default
    )
    _until_training(job)
    ended = signal_and_wait(job, signal.SIGINT, timeout)
    if ended is None:
        return False, timeout, "the job did not end after SIGINT"
    _, err, took = ended
    if "Traceback" in err:
        return False, took, f"exit {job.returncode} with a traceback: {err.strip().splitlines()[-1]}"
    if launcher_family(command[0]) != "hydra":
        ok = job.returncode != 0
        return ok, took, f"exit {job.returncode}: the launcher ended the ranks itself, silently"
    ours = [line for line in err.splitlines() if line.strip() and not line.startswith("[mpiexec@")]
    statuses = statuses_after_signal(command[0], 130)  # Hydra 4.0 may exit 0 whatever its ranks said
    if job.returncode not in statuses or len(ours) != 1:
        return False, took, f"exit {job.returncode}, {len(ours)} line(s) of its own: {ours[:2]}"
    return True, took, f"exit {job.returncode}: {ours[0]}"


def sigint_to_one_rank(command: list[str], env: dict | None = None, timeout: float = 60) -> tuple[bool, float, str]:
    env = {**os.environ, **(env or {})}
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    for line in job.stdout:  # the start line names each rank's pid; then an epoch: the job trains
        pid = pid or next(iter(re.findall(r"rank 1 = pid (\d+)", line)), None)
        if line.startswith("epoch"):
            break
    if pid is None:
        job.kill()
        job.communicate()
        return False, 0.0, "no start line naming rank 1's pid"
    start = time.perf_counter()
    os.kill(int(pid), signal.SIGINT)
    try:
        _, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        job.communicate()
        return False, timeout, "the job did not end after SIGINT to rank 1"
    took = time.perf_counter() - start
    ours = [line for line in err.splitlines() if line.startswith("mpi_sgd:") or "Traceback" in line]
    if len(ours) != 1 or "rank 1 of 2" not in ours[0] or "interrupted alone" not in ours[0]:
        return False, took, f"exit {job.returncode}, {len(ours)} line(s) of its own: {ours[:2]}"
    return job.returncode != 0, took, f"exit {job.returncode}: {ours[0]}"


def killed_outright(command: list[str], env: dict | None = None, timeout: float = 60) -> tuple[bool, float, str]:
    """``command`` must start two ranks that note their pids and wait (:data:`WAITS`)."""
    drill_dir = tempfile.mkdtemp(prefix="mpi-sgd-drill-")
    env = {**os.environ, **(env or {}), "MPI_SGD_DRILL_DIR": drill_dir}
    before = {p.name for p in residue.segments()}
    sessions_before = {p.name for p in residue.sessions()}
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + timeout
        while len(pids) < 2 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = [int(name) for name in os.listdir(drill_dir)]
    finally:
        # Open MPI starts its ranks in a session of their own: killed by pid, not by group
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        shutil.rmtree(drill_dir, ignore_errors=True)
    killed_at, start = time.time(), time.perf_counter()
    time.sleep(0.5)  # the kernel unmaps a killed process's memory as it reaps it
    left = {p.name for p in residue.segments()} - before
    # Other jobs may run beside the drill (a test suite's parallel workers): the clean takes only
    # what was there before the kill, so a job starting now keeps the segment it has not mapped
    # yet, and what is left counts only where no live process maps it (another job's is mapped).
    removed = {name for name, _ in residue.clean(grace=time.time() - killed_at) if name in left}
    still = {p.name for p in residue.orphans(grace=0)} - before
    sessions_left = {p.name for p in residue.stale_sessions()} - sessions_before  # not another job's live one
    residue.clean_sessions()
    sessions_still = sessions_left & {p.name for p in residue.sessions()}
    took = time.perf_counter() - start
    if len(pids) < 2 or still or sessions_still:
        return False, took, f"{len(pids)} rank(s) started; still there: {sorted(still | sessions_still)}"
    said = f"killed; {len(left)} file(s) left in /dev/shm, {len(removed)} removed by the next clean"
    return True, took, f"{said}; {len(sessions_left)} launcher session(s) in the temporary directory, removed too"
