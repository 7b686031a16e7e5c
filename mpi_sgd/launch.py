"""Where this process sits in the job, and what happens when it fails.

Launchers announce rank and size in environment variables of their own. They are read here,
in one place, for the code that must know them before any communicator exists (choosing a
GPU before NCCL starts, say). Once MPI is up, :class:`~mpi_sgd.comm.backends.mpi.MPIComm` asks MPI
itself, which is authoritative.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass


def env_flag(name: str, environ: Mapping[str, str] | None = None, default: bool = False) -> bool:
    """A yes/no switch from the environment: '', 0, false, no and off mean no; unset: ``default``."""
    value = (os.environ if environ is None else environ).get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def env_seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """A duration in seconds from the environment (``default`` if unset); ValueError if not one."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{name} must be 0 or more seconds, got {value!r}")
    return seconds


@dataclass(frozen=True)
class Placement:
    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str


# Checked in this order: an mpiexec run inside a Slurm allocation inherits SLURM_* variables of
# the batch step (SLURM_PROCID=0 on every rank), so the MPI launcher's own variables win.
_LAUNCHERS = (
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
)


def _slurm_local_size(env: Mapping[str, str]) -> int:
    """Tasks on this node. SLURM_TASKS_PER_NODE reads like '2(x3),1'; SLURM_NODEID picks the entry."""
    if "SLURM_NTASKS_PER_NODE" in env:
        return int(env["SLURM_NTASKS_PER_NODE"])
    per_node: list[int] = []
    for part in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            per_node += [int(m.group(1))] * int(m.group(2) or 1)
    node = int(env.get("SLURM_NODEID", 0))
    return per_node[node] if node < len(per_node) else 1


def placement(env: Mapping[str, str] | None = None) -> Placement:
    """Rank, size, local rank and local size as the launcher announced them (1 process if none)."""
    env = os.environ if env is None else env
    for name, rank, size, local_rank, local_size in _LAUNCHERS:
        if rank in env and size in env:
            lr = int(env.get(local_rank, 0))
            if local_size is None:
                ls = _slurm_local_size(env)
            else:
                ls = int(env.get(local_size, 1))
            return Placement(int(env[rank]), int(env[size]), lr, ls, name)
    return Placement(0, 1, 0, 1, "none")


def check_world(size: int, env: Mapping[str, str] | None = None) -> None:
    """Stop when Slurm started several tasks but MPI sees a world of one in each.

    Plain ``srun python script.py``, without a PMI that this MPI understands, starts N separate
    singletons: each would train alone on all the data and report success. ``srun`` announces
    the step's size in ``SLURM_STEP_NUM_TASKS``; MPI's own size must match it.
    """
    env = os.environ if env is None else env
    try:
        tasks = int(env.get("SLURM_STEP_NUM_TASKS", "1"))
    except ValueError:
        return
    if size == 1 and tasks > 1:
        sys.stderr.write(
            f"mpi_sgd: Slurm started {tasks} tasks in this step, but MPI sees a world of 1 in each: srun started "
            "them without a PMI this MPI understands, so each would train alone. Launch with srun --mpi=pmix "
            "(or --mpi=pmi2; srun --mpi=list shows what your Slurm offers), or run mpiexec inside the allocation "
            "(see hostfiles/slurm.sbatch).\n"
        )
        sys.exit(2)


class JobError(RuntimeError):
    """A failure whose message says all there is to say: reported without a traceback."""


class PeerGone(JobError):
    """This rank found another one dead: it witnessed the failure and did not cause it."""


def install_abort_hook(comm) -> None:
    """Make an uncaught exception on any rank end the whole job, naming the rank.

    Without this, a rank that raises simply exits while the others wait in their next
    collective forever. ``python -m mpi4py script.py`` does the same; this hook makes plain
    ``mpiexec python script.py`` safe as well. A :class:`JobError` prints its message alone.
    """

    def hook(kind, value, tb):
        lost = peer_lost(str(value)) or (str(value) if isinstance(value, PeerGone) else None)
        if issubclass(kind, JobError):
            text = f"{value}\n"
        else:
            text = "".join(traceback.format_exception(kind, value, tb))
        if comm.size == 1:  # nobody to wait for: report and let the process exit with status 1
            sys.stderr.write(text)
            return
        # The process's own stderr, not sys.stderr: torch.distributed's hook (installed by
        # init_process_group around this one) points sys.stderr at a buffer it prints after this
        # hook returns, and this hook ends the process first: the message would be lost.
        err = sys.__stderr__ or sys.stderr
        where = f"rank {comm.rank} of {comm.size} on {socket.gethostname()}"
        if lost:
            # A witness, not the cause: the dead rank's line and the launcher's end of the job come
            # first. Still here, this launcher leaves jobs running (hydra -disable-auto-cleanup).
            time.sleep(PEER_LOST_GRACE_S)
            err.write(
                f"mpi_sgd: {where} lost another rank ({lost}); that rank has most likely died "
                "(the launcher names it); aborting the job.\n"
            )
        else:
            err.write(f"mpi_sgd: {where} failed; aborting the job.\n{text}")
        err.flush()
        # The launcher forwards stderr through a pipe that MPI_Abort tears down at once: a moment
        # for the message to get through under load costs nothing next to a job ending anyway.
        time.sleep(0.5)
        comm.abort(1)

    sys.excepthook = hook
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, lambda *_: interrupted(comm.rank, comm.size, comm.abort))


PEER_LOST_GRACE_S = 2.0
# What gloo (and TCP under it) says when the other end of a connection is gone.
_PEER_LOST = re.compile(r"(Connection (closed|reset) by peer|Broken pipe)[^\n]*")


def peer_lost(text: str) -> str | None:
    """The phrase of ``text`` (an exception's) that says a peer's connection closed, or None."""
    found = _PEER_LOST.search(text)
    return found.group(0).strip() if found else None


def interrupted(rank: int, size: int = 1, abort=None) -> None:
    """Ctrl-C: the launcher passes SIGINT to every rank, each of which would print a traceback and
    abort over the others: instead one line (rank 0's), and every rank leaves with status 130.
    SIGINT to one rank alone (``kill -INT``): that rank waits a moment, in which a job-wide one
    ends it (rank 0 exits); still here, it names itself and ends the job, lest the others blame
    themselves in their next collective."""
    if rank == 0:
        sys.stderr.write("mpi_sgd: interrupted (Ctrl-C); nothing is saved (SIGTERM or SIGUSR1 save the step first)\n")
    elif size > 1 and abort is not None:
        time.sleep(PEER_LOST_GRACE_S)
        sys.stderr.write(f"mpi_sgd: rank {rank} of {size} on {socket.gethostname()} interrupted alone: job ended\n")
        sys.stderr.flush()
        abort(128 + signal.SIGINT)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # the launcher's pipe may be gone already
    os._exit(128 + signal.SIGINT)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a batch system or container may
    narrow), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pin_threads(local_size: int) -> int:
    """Give each rank on a node its share of the cores, unless the user chose (OMP_NUM_THREADS).

    torch starts one intra-op thread per core in every process; four ranks on two cores would
    otherwise run eight busy threads and time each other's context switches.
    """
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_size)))
    return torch.get_num_threads()


# How to reach the hosts (the cluster's ssh, the interface): the user's settings, kept for new jobs.
# The user's launcher settings, kept when an enclosing job's variables are dropped: how hydra
# starts remote ranks, and Open MPI's switches without which it starts nothing at all as root
# (containers, CI) or with more ranks than cores.
LAUNCHER_SETTINGS = (
    "HYDRA_LAUNCHER_EXEC",
    "HYDRA_LAUNCHER",
    "HYDRA_IFACE",
    "OMPI_ALLOW_RUN_AS_ROOT",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
    "OMPI_MCA_rmaps_base_oversubscribe",
)


# Open MPI's MCA parameters are the user's settings (``OMPI_MCA_btl``, ``PRTE_MCA_*``), except these,
# which its launcher sets for each rank of the job it starts (where the job's server is, which
# rank this is); they must not reach a job of its own.
_JOB_MCA = ("OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir", "OMPI_MCA_prte_")


def _kept(name: str) -> bool:
    if name in LAUNCHER_SETTINGS or name.startswith("PRTE_MCA_"):
        return True
    if name.startswith("OMPI_MCA_"):
        return not name.startswith(_JOB_MCA)
    return not name.startswith(("PMI_", "HYDRA_", "OMPI_", "PMIX_", "PRTE_"))


def standalone_env() -> dict[str, str]:
    """This environment without an enclosing MPI job's rank variables (``PMI_*``, ``PMIX_*``,
    ``HYDRA_*``, ``OMPI_COMM_WORLD_*`` and Open MPI's other per-job ``OMPI_*``), keeping
    :data:`LAUNCHER_SETTINGS` and the user's MCA parameters (``OMPI_MCA_*``, ``PRTE_MCA_*``): a job
    started from here is a job of its own, and still starts under the MPI's own rules (root,
    oversubscription, transports)."""
    return {k: v for k, v in os.environ.items() if _kept(k)}


def mpiexec_command(ranks: int, *argv: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that start ``ranks`` copies of this Python running ``argv``.

    For commands that, started as one process, launch an MPI job of their own. The launcher is
    ``MPI_SGD_MPIEXEC`` if set, else the ``mpiexec`` installed beside this Python (the MPI wheel
    puts it there), else the one on PATH. Launcher variables of an enclosing job are dropped so
    the new job does not mistake itself for part of it.
    """
    import shlex
    import shutil
    from pathlib import Path

    if os.environ.get("MPI_SGD_MPIEXEC"):
        mpiexec = shlex.split(os.environ["MPI_SGD_MPIEXEC"])  # may carry flags: "mpiexec --oversubscribe"
    else:
        beside = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
        mpiexec = [beside or shutil.which("mpiexec") or "mpiexec"]
    return [*mpiexec, "-n", str(ranks), sys.executable, *argv], standalone_env()


class JobFailed(RuntimeError):
    """A job started by :func:`run_job` exited non-zero; the message carries its output."""

    def __init__(self, cmd: list[str], returncode: int, output: str):
        super().__init__(f"{' '.join(cmd)} failed (exit {returncode}):\n{output}")
        self.returncode = returncode
        self.output = output


def run_job(ranks: int, *argv: str, env: dict[str, str] | None = None, echo: bool = False) -> None:
    """Run ``ranks`` copies of this Python on ``argv`` (see :func:`mpiexec_command`) to the end.

    ``env`` adds variables for the job; ``echo`` prints the command line first. Output is kept,
    and shown only in the :class:`JobFailed` raised when the job fails.
    """
    import subprocess

    cmd, job_env = mpiexec_command(ranks, *argv)
    job_env.update(env or {})
    if echo:
        from .launchers import short_command

        print(short_command(cmd, env), flush=True)
    done = subprocess.run(cmd, env=job_env, capture_output=True, text=True)
    if done.returncode != 0:
        raise JobFailed(cmd, done.returncode, done.stdout + done.stderr)
