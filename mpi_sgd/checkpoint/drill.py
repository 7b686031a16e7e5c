"""Kill drills: SIGKILL a checkpoint save at each of its steps, or a training job in mid-run.

Each drill runs one case and returns ``(ok, seconds, message)``, so a test can assert on it and a
table of fault cases can print it. Real processes die by real ``SIGKILL``; nothing is simulated.

* :func:`kill_during_save` forks a child that saves checkpoint 2 over a directory holding
  checkpoint 1 and kills itself with ``SIGKILL`` just before the ``point``-th file-system step of
  the save (or halfway through writing a file; :func:`save_points` names them all). Then the
  newest checkpoint that verifies must be 1 or 2, byte for byte, and the next save must leave
  exactly itself and ``latest`` behind, the interrupted save's temporary files removed.
* :func:`kill_and_resume` runs a training command three times: through to the end into one
  directory; killed (``SIGKILL`` to its whole process group) once its first checkpoint exists;
  and resumed with ``--resume auto``. The two runs' final checkpoints must be bit-identical.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from ..launchers import signal_and_wait, statuses_after_signal, stop_signal
from . import store


def _blob(tag: int) -> bytes:
    return (f"checkpoint {tag} ".encode() * 4096)[: 50_000 + tag]  # distinct sizes and contents


class _Killer:
    """Counts the save's file-system steps (writes, fsyncs, renames, removals) and SIGKILLs this
    process at the chosen one; with ``point=None`` it only records their names."""

    def __init__(self, point: int | None):
        self.point, self.names = point, []

    def _step(self, name: str, half_write=None) -> None:
        self.names.append(name)
        if self.point == len(self.names) - 1:
            if half_write:
                half_write()
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        write, fsync_dir, rename, replace, rmtree = store._write, store._fsync_dir, os.rename, os.replace, shutil.rmtree

        def _write(path, blob):
            base = _role(path, "the new latest pointer")
            self._step(f"before writing {base}")
            self._step(f"halfway through writing {base}", lambda: write(path, blob[: len(blob) // 2]))
            write(path, blob)

        def _fsync_dir(path):
            self._step("before fsync of " + _role(path, "the new checkpoint's temporary directory"))
            fsync_dir(path)

        def _rename(src, dst):
            self._step("before rename to " + _role(dst, "a temporary name"))
            rename(src, dst)

        def _replace(src, dst):
            self._step(f"before replacing {os.path.basename(dst)}")
            replace(src, dst)

        def _rmtree(path, *a, **kw):
            self._step(f"before removing {os.path.basename(path)}")
            rmtree(path, *a, **kw)

        store._write, store._fsync_dir, os.rename, os.replace, shutil.rmtree = (
            _write,
            _fsync_dir,
            _rename,
            _replace,
            _rmtree,
        )


def _role(path: str, temporary: str) -> str:
    """A path as a stable name (temporary ones are random): ``temporary`` for those."""
    base = os.path.basename(os.path.normpath(path))
    if not base.startswith(store.TEMP_PREFIX) and not os.path.splitext(base)[1] and not base.startswith("step-"):
        return "the checkpoint directory"
    return temporary if base.startswith(store.TEMP_PREFIX) else base


def _prepared(directory: str) -> None:
    store.save(_blob(1), {"step": 1}, directory, 1, keep=1)


def save_points() -> list[str]:
    """The names of the steps of a save that replaces one checkpoint (``keep=1``), in order."""
    with tempfile.TemporaryDirectory() as d:
        _prepared(d)
        pid = os.fork()
        if pid == 0:  # the child records, and hands the names back through a file
            killer = _Killer(None)
            killer.install()
            store.save(_blob(2), {"step": 2}, d, 2, keep=1)
            with open(os.path.join(d, "points.txt"), "w") as f:
                f.write("\n".join(killer.names))
            os._exit(0)
        os.waitpid(pid, 0)
        with open(os.path.join(d, "points.txt")) as f:
            return f.read().splitlines()


def kill_during_save(point: int) -> tuple[bool, float, str]:
    """SIGKILL a save at step ``point`` of :func:`save_points`; check what a resume would find."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        _prepared(d)
        pid = os.fork()
        if pid == 0:
            _Killer(point).install()
            store.save(_blob(2), {"step": 2}, d, 2, keep=1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            return False, time.perf_counter() - start, f"the save was not killed at point {point} (status {status})"
        warnings: list[str] = []
        found = store.newest_valid(d, warnings.append)
        if found is None:
            return False, time.perf_counter() - start, "no loadable checkpoint after the kill"
        path, blob, meta = found
        if blob != _blob(meta["step"]):
            return False, time.perf_counter() - start, f"{os.path.basename(path)} verified but holds other bytes"
        store.save(_blob(3), {"step": 3}, d, 3, keep=1)
        left = sorted(os.listdir(d))
        ok = left == [store.LATEST, store.step_name(3)]
        took = time.perf_counter() - start
        if not ok:
            return False, took, f"after the next save the directory holds {left}"
        return True, took, f"resumes from step {meta['step']}; next save left {left}"


def kill_and_resume(command: list[str], env: dict | None = None, timeout: float = 120) -> tuple[bool, float, str]:
    """Train with ``command + ['--checkpoint', DIR]`` uninterrupted, then killed after its first
    checkpoint and resumed with ``--resume auto``; compare the final checkpoints bit for bit.

    ``command`` must run several epochs (a checkpoint after each) and accept those flags, e.g.
    ``[mpiexec, '-n', '2', python, 'examples/sync_sgd.py', '--epochs', '6']``.
    """
    import torch

    from . import deserialize

    start = time.perf_counter()
    env = {**os.environ, **(env or {})}
    with tempfile.TemporaryDirectory() as d:
        whole, killed = os.path.join(d, "whole"), os.path.join(d, "killed")
        first = subprocess.run(
            [*command, "--checkpoint", whole], env=env, capture_output=True, text=True, timeout=timeout
        )
        if first.returncode != 0:
            said = (first.stdout + first.stderr).strip()[-600:]
            return False, time.perf_counter() - start, f"the uninterrupted run failed (exit {first.returncode}): {said}"
        job = subprocess.Popen(
            [*command, "--checkpoint", killed],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not store.checkpoints(killed) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if job.poll() is not None:
            return False, time.perf_counter() - start, "the job ended before it could be killed; give it more epochs"
        os.killpg(job.pid, signal.SIGKILL)  # mpiexec, its proxies and every rank
        job.wait()
        at_kill = [os.path.basename(p) for p in store.checkpoints(killed)]
        resumed = subprocess.run(
            [*command, "--checkpoint", killed, "--resume", "auto"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if resumed.returncode != 0:
            return False, time.perf_counter() - start, f"the resumed run failed: {resumed.stderr.strip()[-300:]}"
        found_a, found_b = store.newest_valid(whole, print), store.newest_valid(killed, print)
        if found_a is None or found_b is None:
            return False, time.perf_counter() - start, "no valid checkpoint at the end of a run"
        (a_path, a_blob, _), (b_path, b_blob, _) = found_a, found_b
        a, b = deserialize(a_blob, a_path), deserialize(b_blob, b_path)
        same = a["step"] == b["step"] and all(
            torch.equal(x, y) for part in ("model",) for x, y in zip(a[part].values(), b[part].values(), strict=True)
        )
        same = same and _equal(a["optimizer"], b["optimizer"])
        took = time.perf_counter() - start
        if not same:
            return False, took, f"killed at {at_kill}, resumed: final state differs from the uninterrupted run's"
        return True, took, f"killed with {at_kill} on disk; resumed to step {b['step']}, bit-identical"


def _equal(x, y) -> bool:
    import torch

    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y, strict=True))
    return x == y


def sigterm_saves(command: list[str], env: dict | None = None, timeout: float = 120) -> tuple[bool, float, str]:
    """Start ``command + ['--checkpoint', DIR]``, signal its launcher mid-epoch once it trains (as
    Slurm ends a job: SIGTERM, or SIGUSR1 for Open MPI's, see :func:`mpi_sgd.launchers.stop_signal`),
    and check that it exits 75 (what the launcher makes of it: :func:`mpi_sgd.launchers.statuses_after_signal`)
    having saved the step it stopped at, newest in
    ``DIR``. The seconds are from the signal to the job's exit: the step, the save and the exit."""
    import re

    env = {**os.environ, **(env or {})}
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "ck")
        job = subprocess.Popen([*command, "--checkpoint", ck], env=env, stdout=subprocess.PIPE, text=True)
        for line in job.stdout:
            if line.startswith("epoch"):  # an epoch done: the next one is under way
                break
        time.sleep(0.2)  # into the next epoch, between its checkpoints
        ended = signal_and_wait(job, stop_signal(command[0]), timeout)
        if ended is None:
            return False, timeout, "the job did not end after the signal"
        out, _, took = ended
        said = re.search(r"^saved step (\d+) to .* on SIG(TERM|USR1)", out, re.M)
        newest = store.checkpoints(ck)[:1]
        statuses = statuses_after_signal(command[0], 75)  # Hydra 4.0 may exit 0 whatever its ranks said
        if job.returncode not in statuses or not said or not newest:
            return False, took, f"exit {job.returncode}, said {said and said.group(0)!r}, checkpoints {newest}"
        if not newest[0].endswith(store.step_name(int(said.group(1)))):
            return False, took, f"said step {said.group(1)} but the newest checkpoint is {newest[0]}"
        return True, took, f"exit {job.returncode}; saved step {said.group(1)}, the newest checkpoint"
