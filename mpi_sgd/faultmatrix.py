"""``mpi-sgd faults``: break a training job in every way we know, and time how it ends.

Each case launches a real two-rank job of a training script (``--script``, e.g. the examples'
``sync_sgd.py``) with one thing wrong: a fault injected on rank 1 (``MPI_SGD_FAULT``, see
:mod:`mpi_sgd.comm.wrappers.faults`), a bad argument, a dataset too small for the batch, a hostfile that
does not exist; then the drills (:data:`DRILLS`): checkpoints under kills and SIGTERM, Ctrl-C, and a
job killed outright. A case passes when the job
ends with the status it should, prints a message naming the cause (and, for every injected fault,
the rank to blame: rank 1; for a refused input, exit 2, that message once and no traceback), and
ends within its bound: seconds after the fault for injected ones (read from the line the faulty
rank prints as it acts), from the launch for the rest. Stall cases run with
``--stall-timeout`` seconds of patience, so their bound is that plus the same 10 seconds.

A rank killed by a signal cannot speak, and the launcher names only its process ID; the job's start
line maps process IDs to ranks, so the table shows "rank 1 (pid N on HOST) killed by signal 9"
(:func:`mpi_sgd.launchers.explain_death`) after the launcher's own report.

The table is the whole result: case, expected status, bound, time taken, and the message line
the check found. Add a case by appending a :class:`Case` to :data:`CASES`.

Why one module of over 300 lines: the cases are data, and each one's setup (a held lock, an
unreadable checkpoint) and its verdict must be read next to it to see what the row checks; the
drills themselves live in :mod:`.checkpoint.drill` and :mod:`.jobdrills`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .args import add_command, flag, positive_float
from .launch import mpiexec_command
from .launchers import WIDTH, explain_death, run_job
from .report import markdown_table

SLACK = 10.0  # seconds a failure may take to end the job, after the fault (or the timeout)
LAUNCH_BOUND = 60.0  # cases with no fault time: from launch, python and torch start-up included
TRAIN = ("--epochs", "1", "--val-fraction", "0", "--max-steps", "12", "--batch-size", "16", "--no-progress")


@dataclass(frozen=True)
class Case:
    name: str
    expect: str  # a regular expression the job's output must match (one line is shown)
    status: str = "non-zero"  # "0", "2" or "non-zero"
    fault: str | None = None  # MPI_SGD_FAULT
    args: tuple[str, ...] = ()  # added to the script's arguments
    launcher: tuple[str, ...] = ()  # added to mpiexec's
    stall: bool = False  # bound: the stall timeout + SLACK
    env: dict = field(default_factory=dict)
    # "{ck}" in args: a fresh checkpoint directory; setup(ck) prepares it before the launch and
    # returns what undoes it (or None)
    setup: Callable[[str], Callable[[], None] | None] | None = None
    # rank 1 as a program of its own (mpiexec -n 1 ... : -n 1 ...), these arguments added: a rank
    # whose input differs from rank 0's, as a file missing on one host makes it
    rank1_args: tuple[str, ...] = ()

    @property
    def blame(self) -> int | None:
        """The rank the message must name: the faulty one, for an injected fault."""
        return int(self.fault.split(":")[0]) if self.fault else None


KILLED_OR_CANNOT_TELL = (
    r"rank 1 \(pid \d+ on \S+\) killed by signal 9|(rank \d+ or )+rank \d+ ended the job .*cannot be told"
)

CASES = (
    Case("no fault", r"\d+ steps; per step", status="0"),
    Case("raise on rank 1", r"rank 1 of 2 on \S+ failed.*", fault="1:3:raise"),
    # Intel MPI's launcher cannot say which rank died first; the line says so, naming rank 1 among them.
    Case("SIGKILL of rank 1", KILLED_OR_CANNOT_TELL, fault="1:3:kill"),
    # Under gloo the healthy rank sees its connection close and aborts too: it must not be blamed.
    Case(
        "SIGKILL of rank 1, gloo",
        KILLED_OR_CANNOT_TELL,
        fault="1:3:kill",
        args=("--backend", "gloo"),
    ),
    Case("rank 1 stalls", r"watchdog: .* rank 1 missing.*", fault="1:3:stall", stall=True),
    Case("rank 1 exits 0 early", r"rank 1 has left the job.*", fault="1:3:exit0", stall=True),
    # The NaN enters inside rank 1's all-reduce, after the trainer's local check: every rank sees a
    # non-finite sum at the same step and stops. The sum cannot tell who sent it; the fault's wrapper
    # can, and the trainer's message names the rank it says (a real corruption would name none).
    Case("NaN in rank 1's all-reduce", r"training diverged: .*corrupted in transit by rank 1 .*", fault="1:3:nan"),
    # Caught by the per-call check (callcheck.py), the shared-memory all-reduce's own check or the watchdog.
    Case(
        "rank 1's all-reduce 1 short",
        r"(watchdog: ranks made different collective calls.*(\n  rank \d+: .*){2}|rank 1 made a different "
        r"reduction.*(\n  rank \d+: .*){2}|ranks passed different "
        r"shared buffers to all-reduce.*rank.*)",
        fault="1:3:shape",
    ),
    Case("bad argument", r".*--lr must be positive.*", status="2", args=("--lr", "-1")),
    Case("dataset too small", r".*one step needs R\*B.*", status="2", args=("--batch-size", "100000")),
    Case("hostfile missing", r".*(hostfile|host file|No such file).*", launcher=("--hostfile", "no-such-hostfile")),
)
# Checkpoint drills (mpi_sgd.checkpoint.drill): each returns (ok, seconds, message) itself. The test
# suite runs them on their own (tests/unit/test_checkpoint_dirs.py, tests/integration/test_reliability_jobs.py).
DRILLS = (
    "SIGKILL at every step of a save",
    "SIGKILL mid-run, then --resume auto",
    "SIGTERM mid-epoch: the step saved",
    "Ctrl-C: one line, no traceback",  # mpi_sgd.jobdrills
    "SIGINT to rank 1 alone: named, job ended",
    "launcher and ranks SIGKILLed: /dev/shm clean",
)
# the whole drill: 12 saves killed; three training runs; SIGTERM to exit for the MLP at R = 2
DRILL_BOUNDS = {DRILLS[0]: 30.0, DRILLS[1]: 240.0, DRILLS[2]: 10.0, DRILLS[3]: 10.0, DRILLS[4]: 10.0, DRILLS[5]: 10.0}


@dataclass
class Outcome:
    case: Case
    status: int
    seconds: float  # after the fault, or after the launch when no fault time was printed
    bound: float
    message: str  # the line that matched, or why the case failed
    passed: bool
    # The job's last lines, stdout's then stderr's: what a failed case's report shows, since the
    # launcher's verdict (hydra's BAD TERMINATION block) and the ranks' lines go to different streams.
    tail: str = ""


def run_case(case: Case, script: str, stall_timeout: float, cwd: str | None = None) -> Outcome:
    with tempfile.TemporaryDirectory() as tmp:
        ck = os.path.join(tmp, "ck")
        args = [a.replace("{ck}", ck) for a in case.args]
        common = (script, *TRAIN, "--stall-timeout", f"{stall_timeout:g}", *args)
        cmd, env = mpiexec_command(1 if case.rank1_args else 2, *common)
        cmd = [cmd[0], *case.launcher, *cmd[1:]]
        if case.rank1_args:
            cmd += [":", "-n", "1", sys.executable, *common, *case.rank1_args]
        env = {**env, **case.env, "MPIEXEC_TIMEOUT": str(int(LAUNCH_BOUND + stall_timeout + 2 * SLACK))}
        env.pop("MPI_SGD_FAULT", None)
        if case.fault:
            env["MPI_SGD_FAULT"] = case.fault
        undo = case.setup(ck) if case.setup else None
        start = time.time()
        try:
            done = run_job(cmd, case.name, env=env, cwd=cwd, timeout=240)
            status, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:
            status, out, err = -9, f"hung: killed after {e.timeout} s\n{_text(e.stdout)}", _text(e.stderr)
        finally:
            if undo:
                undo()
    outcome = judge(case, status, out + err, start, time.time(), stall_timeout)
    outcome.tail = f"stdout:\n{_last_lines(out)}\nstderr:\n{_last_lines(err)}"
    return outcome


def _text(read: str | bytes | None) -> str:
    """What a timed-out run had printed: TimeoutExpired keeps it as bytes even for a text run."""
    return read.decode(errors="replace") if isinstance(read, bytes) else read or ""


def _last_lines(text: str, n: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:]) or "(nothing)"


def judge(case: Case, status: int, output: str, start: float, end: float, stall_timeout: float) -> Outcome:
    """Did the job that ran ``case`` (exit ``status``, ``output``, launched and ended at wall-clock
    ``start`` and ``end``) end as it should?"""
    from .comm.wrappers.faults import ANNOUNCE

    fault_at = re.search(rf"^{re.escape(ANNOUNCE)} .* at ([\d.]+)$", output, re.M)
    death = explain_death(output)
    if death:  # the launcher named a PID: add the rank it was, as one more line to match
        output += f"\n{death}\n"
    seconds = end - (float(fault_at.group(1)) if fault_at else start)
    bound = (stall_timeout if case.stall else 0.0) + SLACK if fault_at else LAUNCH_BOUND
    found = re.search(case.expect, output, re.M)
    status_ok = {"0": status == 0, "2": status == 2}.get(case.status, status not in (0, -9))
    if case.fault and not fault_at:
        message = "the fault was never injected"
    elif not found:
        message = f"no line matches {case.expect!r}; last lines: " + " | ".join(output.strip().splitlines()[-3:])
    else:
        message = " ".join(found.group(0).split())  # a report of several lines: one row
    names_blame = case.blame is None or bool(found and re.search(rf"\brank {case.blame}\b", message[:160]))
    if found and not names_blame:
        message = f"does not name rank {case.blame}: {message}"
    # A refused input is one line from the root, not one per rank, and no traceback.
    times = len(re.findall(case.expect, output, re.M))
    one_line = case.status != "2" or (times == 1 and "Traceback" not in output)
    if found and not one_line:
        message = f"printed {times} times{' with a traceback' if 'Traceback' in output else ''}: {message}"
    passed = bool(
        status_ok and found and names_blame and one_line and seconds <= bound and (fault_at or not case.fault)
    )
    return Outcome(case, status, seconds, bound, message[:160], passed)


def table(outcomes: list[Outcome], width: int = WIDTH) -> str:
    """The matrix as a markdown table whose lines fit ``width`` columns: each message is cut to what
    is left of the line (the whole of it is in the JSON :func:`_run` writes)."""
    rows = [
        [o.case.name, o.case.status, o.status, f"{o.bound:g} s", f"{o.seconds:.1f} s", "pass" if o.passed else "FAIL"]
        for o in outcomes
    ]
    headers = ["case", "expected exit", "exit", "bound", "took", "result"]
    used = len(markdown_table(headers, rows).splitlines()[0])  # "| case | ... | result |"
    room = max(len("message"), width - used - 3)  # " message |" after it
    cut = [o.message if len(o.message) <= room else o.message[: room - 1] + "…" for o in outcomes]
    return markdown_table([*headers, "message"], [[*r, m] for r, m in zip(rows, cut, strict=True)])


# Checkpoints against their storage and a second job (mpi_sgd.checkpoint); "{ck}" is each case's own
# directory. The signal cases are drills (DRILLS), since a signal needs a job already training.


def _held_by_another_job(ck: str):
    """A second process holds ``ck``'s lock (mpi_sgd.checkpoint.lock), as a job running there would."""
    code = "import sys, time\nfrom mpi_sgd.checkpoint.lock import acquire\nacquire(sys.argv[1])\nprint(1, flush=True)\n"
    holder = subprocess.Popen([sys.executable, "-c", code + "time.sleep(600)", ck], stdout=subprocess.PIPE)
    holder.stdout.readline()  # the lock is held from here on

    def release():
        holder.kill()
        holder.wait()
        holder.stdout.close()

    return release


def _only_unreadable(ck: str):
    """``ck`` holds one checkpoint, its state overwritten after it was saved (a disk or NFS fault)."""
    from .checkpoint import store

    path = store.save(b"state", {"step": 5}, ck, 5)
    with open(os.path.join(path, store.STATE), "wb") as f:
        f.write(b"garbage")


def _beyond_float32(ck: str):
    """A data file ``ck``.npz whose float64 x holds one value float32 cannot (it would become inf)."""
    import numpy as np

    x = np.zeros((256, 4))
    x[3, 1] = 1e39
    np.savez(f"{ck}.npz", x=x, y=np.arange(256) % 2)


def _another_runs_checkpoints(ck: str):
    """``ck`` holds a checkpoint of one run, ``ck``-other one of another."""
    from .checkpoint import store

    for d in (ck, f"{ck}-other"):
        store.save(b"state", {"step": 5}, d, 5)


CK = ("--checkpoint", "{ck}")
CHECKPOINT_CASES = (
    Case(
        "second job in one --checkpoint",
        r".*is in use by another job \(host \S+, pid \d+, started .*",
        status="2",
        args=CK,
        setup=_held_by_another_job,
    ),
    Case(
        "only unreadable checkpoints",
        r".*none of the 1 checkpoint.* can be read.*",
        status="2",
        args=(*CK, "--resume", "auto"),
        setup=_only_unreadable,
    ),
    # rank 0 writes for longer than the others' --stall-timeout: a save, not a stall
    Case("slow save (6 s)", r"\d+ steps; per step", status="0", args=CK, env={"MPI_SGD_SAVE_FAULT": "slow:6"}),
    Case(
        "hung save",
        r"checkpoint save hung: saving step \d+ to .*",
        args=(*CK, "--save-timeout", "2"),
        env={"MPI_SGD_SAVE_FAULT": "slow:600"},
    ),
    # rank 0 reads (and refuses) the checkpoint for longer than the others' --stall-timeout: a
    # read, not a stall; its outcome reaches every rank
    Case(
        "slow read on resume (6 s)",
        r".*none of the 1 checkpoint.* can be read.*",
        status="2",
        args=(*CK, "--resume", "auto"),
        env={"MPI_SGD_SAVE_FAULT": "slow-read:6"},
        setup=_only_unreadable,
    ),
    Case(
        "hung read on resume",
        r"checkpoint read hung: reading checkpoint .*",
        args=(*CK, "--resume", "auto", "--save-timeout", "2"),
        env={"MPI_SGD_SAVE_FAULT": "slow-read:600"},
        setup=_only_unreadable,
    ),
    Case(
        "resume into another run's directory",
        r".*already holds checkpoints of another run, and --resume .* is not one of them.*",
        status="2",
        args=(*CK, "--resume", "{ck}-other"),
        setup=_another_runs_checkpoints,
    ),
    Case(
        "disk full during a save",
        r".*no space left on the device; the checkpoint needs \d+ bytes.*",
        status="2",
        args=CK,
        env={"MPI_SGD_SAVE_FAULT": "full"},
    ),
    Case(
        "unwritable --checkpoint",
        # As a user the check before MPI refuses it (/proc is not writable); root passes that check
        # (access() says yes to root) and the lock's trial write refuses it: one line either way.
        r".*--checkpoint '/proc/\S+' cannot be (written|created).*",
        status="2",
        args=("--checkpoint", "/proc/mpi-sgd-ck"),
    ),
)
# Data that would reach the model as garbage: refused before any communication.
DATA_CASES = (
    # rank 0 passes its checks and waits in MPI's start-up; rank 1 must not leave it there
    Case(
        "bad argument on rank 1 alone",
        r".*error on rank 1 \(\S+\): --lr must be positive.*",
        "2",
        rank1_args=("--lr", "-1"),
    ),
    Case(
        "--metrics-json unwritable",
        r".*--metrics-json '/proc/\S+' cannot be written.*",
        "2",
        args=("--metrics-json", "/proc/m.json"),
    ),
    # fp16 overflows at every scale from the second step: stopped there, not skipped for ever
    Case(
        "fp16 loss not finite", r"training diverged: loss (nan|inf) in step 2 .*", args=("--amp", "fp16", "--lr", "1e6")
    ),
    Case(
        "float64 data beyond float32",
        r".*x holds values beyond float32's range .* the first at index 3",
        status="2",
        args=("--dataset", "{ck}.npz"),
        setup=_beyond_float32,
    ),
)
CASES = CASES + CHECKPOINT_CASES + DATA_CASES


def run(script: str, stall_timeout: float, cases=CASES, cwd: str | None = None, echo: bool = True) -> list[Outcome]:
    outcomes = []
    for case in cases:
        outcomes.append(run_case(case, script, stall_timeout, cwd))
        if echo:
            o = outcomes[-1]
            print(f"{'pass' if o.passed else 'FAIL'}  {case.name}: {o.seconds:.1f} s", flush=True)
    return outcomes


def run_drill(name: str, script: str, cwd: str | None = None) -> Outcome:
    """One of :data:`DRILLS`: every kill point of a save, a job killed and resumed bit for bit, a
    job stopped by SIGTERM, by Ctrl-C, or killed outright."""
    from . import jobdrills
    from .checkpoint import drill

    if name == DRILLS[0]:
        results = [drill.kill_during_save(i) for i in range(len(drill.save_points()))]
        bad = [m for ok, _, m in results if not ok]
        ok, seconds = not bad, sum(t for _, t, _ in results)
        message = bad[0] if bad else f"{len(results)} kill points: the previous checkpoint loaded after every one"
    elif name == DRILLS[1]:
        cmd, env = mpiexec_command(2, script, "--epochs", "4", "--no-progress", "--batch-size", "64")
        ok, seconds, message = drill.kill_and_resume(cmd, env={**env, "OMP_NUM_THREADS": "1"}, timeout=200)
    elif (
        name == DRILLS[2]
    ):  # the 784-1024-1024-10 MLP, a 15 MB checkpoint with its momentum: the save must fit KillWait
        cmd, env = mpiexec_command(2, script, "--model", "mlp", "--epochs", "100", "--no-progress")
        ok, seconds, message = drill.sigterm_saves(cmd, env={**env, "OMP_NUM_THREADS": "1"}, timeout=120)
    elif name == DRILLS[3]:
        cmd, env = mpiexec_command(2, script, "--epochs", "400", "--batch-size", "8", "--no-progress")
        ok, seconds, message = jobdrills.ctrl_c(cmd, env={**env, "OMP_NUM_THREADS": "1"})
    elif name == DRILLS[4]:
        cmd, env = mpiexec_command(2, script, "--epochs", "400", "--batch-size", "8", "--no-progress")
        ok, seconds, message = jobdrills.sigint_to_one_rank(cmd, env={**env, "OMP_NUM_THREADS": "1"})
    else:
        cmd, env = mpiexec_command(2, "-c", jobdrills.WAITS)
        ok, seconds, message = jobdrills.killed_outright(cmd, env={**env, "OMP_NUM_THREADS": "1"})
    bound = DRILL_BOUNDS[name]
    return Outcome(Case(name, "", status="0"), 0 if ok else 1, seconds, bound, message[:160], ok and seconds <= bound)


@dataclass(frozen=True)
class Flags:
    script: str = flag("", "the training script every case launches, e.g. sync_sgd.py", required=True)
    stall_timeout: float = flag(3.0, "the jobs' --stall-timeout in seconds", positive_float)
    only: str | None = flag(None, "run only the cases whose name contains this text (default: all)")
    drills: bool = flag(True, "also run the checkpoint kill drills (a minute or so; --no-drills leaves them out)")


def add_parser(subparsers) -> None:
    add_command(
        subparsers,
        "faults",
        Flags,
        _run,
        help="run the fault-injection matrix (start it as one process)",
        description=__doc__,
    )


def _run(args: Flags) -> int:
    cases = [c for c in CASES if args.only is None or args.only in c.name]
    outcomes = run(args.script, args.stall_timeout, cases)
    for name in [d for d in DRILLS if args.only is None or args.only in d] if args.drills else []:
        outcomes.append(run_drill(name, args.script))
        print(f"{'pass' if outcomes[-1].passed else 'FAIL'}  {name}: {outcomes[-1].seconds:.1f} s", flush=True)
    print()
    print(table(outcomes))
    os.makedirs("results", exist_ok=True)
    with open(os.path.join("results", "faults.json"), "w") as f:
        fields = ("status", "seconds", "bound", "message", "passed")
        json.dump([{"case": o.case.name, **{k: getattr(o, k) for k in fields}} for o in outcomes], f, indent=1)
    print("\nwhole messages: results/faults.json")
    return 0 if all(o.passed for o in outcomes) else 1
