"""Every entry point a user can start, found from the tree, and a way to run one in this process.

An entry point is an example (``examples/*.py``), an ``mpi-sgd`` command, or a module that
``python -m`` runs. :func:`flags_of` reads the flags an entry point accepts from its own parser;
:func:`run` starts it with a command line, as one process with no MPI (a size-1 communicator
stands in for ``comm.init``), with chosen library calls replaced by recorders that note the
arguments each call receives and then call through, return a stand-in, or stop the run there.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import io
import os
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mpi_sgd.comm.backends.local import LocalComm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PACKAGE = ROOT / "mpi_sgd"

# What ``python -m MODULE`` runs, as a function of the command line; mpi_sgd.cli is ``mpi-sgd``.
MODULES = {
    "mpi_sgd.paramserver": "mpi_sgd.paramserver.__main__:main",
    "mpi_sgd.calibrate": "mpi_sgd.calibrate.run:main",
    "mpi_sgd.bench.validate": "mpi_sgd.bench.validate:train_job",
    "mpi_sgd.cluster.netns": "mpi_sgd.cluster.netns:main",
    "mpi_sgd.cluster.probe": "mpi_sgd.cluster.probe:main",
    "mpi_sgd.figures.ring": "mpi_sgd.figures.ring:main",
}
LAUNCHER = ("PMI_", "OMPI_", "PMIX_", "HYDRA_", "SLURM_", "MPI_LOCAL", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def runnable_modules() -> set[str]:
    """Every module of the package that ``python -m`` can run: a package with a ``__main__.py``,
    or a module with an ``if __name__ == "__main__":`` block."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if path.name == "__main__.py":
            found.add(name.removesuffix(".__main__"))
        elif any(
            isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
            for node in ast.parse(path.read_text()).body
        ):
            found.add(name)
    return found - {"mpi_sgd.cli"}


def commands(parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """``mpi-sgd``'s leaf commands: 'mpi-sgd bench sgd' -> ['bench', 'sgd']."""
    from mpi_sgd.cli import build_parser

    parser = parser or build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {" ".join(("mpi-sgd", *prefix)): list(prefix)}
    found = {}
    for name, sub in subs[0].choices.items():
        found |= commands(sub, (*prefix, name))
    return found


def entry_points() -> list[str]:
    scripts = [f"examples/{p.name}" for p in sorted(EXAMPLES.glob("*.py"))]
    return scripts + sorted(commands()) + [f"python -m {m}" for m in sorted(runnable_modules())]


class Reached(Exception):
    """A recorder that stops the run was called: what the probe looks for has happened."""


@dataclass
class Run:
    calls: dict[str, list[dict]] = field(default_factory=dict)
    built: list = field(default_factory=list)  # every flags dataclass the entry point built
    out: str = ""
    err: str = ""
    code: int | None = None  # exit status, None if it returned or stopped at a recorder
    reached: bool = False

    def called(self, target: str) -> list[dict]:
        return self.calls.get(target, [])


class RecordingComm(LocalComm):
    """World size 1 with no MPI, noting the point-to-point sends and all-reduces it is given."""

    def __init__(self, run: Run):
        super().__init__()
        self._run = run

    def isend(self, buf, dest, tag=0):
        self._run.calls.setdefault("comm.isend", []).append({"buf": buf, "dest": dest, "tag": tag})
        return super().isend(buf, dest, tag)

    def allreduce(self, buf, op="sum"):
        self._run.calls.setdefault("comm.allreduce", []).append({"buf": buf, "op": op})
        return super().allreduce(buf, op)


def _resolve(target: str):
    """'mpi_sgd.trainer.Trainer.from_config' -> (Trainer, 'from_config')."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:-1]:
            owner = getattr(owner, part)
        return owner, parts[-1]
    raise ValueError(f"cannot find {target}")


def _recorder(run: Run, target: str, original, behaviour):
    signature = inspect.signature(original)

    def record(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        run.calls.setdefault(target, []).append(dict(bound.arguments))
        if behaviour == "stop":
            raise Reached(target)
        if callable(behaviour):
            return behaviour(dict(bound.arguments), original)
        return original(*args, **kwargs)

    return record


def run(entry: str, argv: list[str], monkeypatch, recorders: dict | None = None, world: int = 1) -> Run:
    """Start ``entry`` with ``argv`` in this process; ``recorders``: target -> 'pass' (note the
    call and make it), 'stop' (note it and end the run there) or f(arguments, original) (note it,
    return what f returns).
    ``world`` is the job size the launcher announces (this process is its rank 0)."""
    result = Run()
    comm = importlib.import_module("mpi_sgd.comm")
    monkeypatch.setattr(comm, "init", _recorder(result, "init", comm.init, lambda a, o: RecordingComm(result)))
    build = importlib.import_module("mpi_sgd.args").ArgumentParser.build

    def building(self, cls, namespace, **given):
        result.built.append(built := build(self, cls, namespace, **given))
        return built

    monkeypatch.setattr("mpi_sgd.args.ArgumentParser.build", building)
    for target, behaviour in (recorders or {}).items():
        owner, name = _resolve(target)
        monkeypatch.setattr(owner, name, _recorder(result, target, getattr(owner, name), behaviour))
    threads, out, err = torch.get_num_threads(), io.StringIO(), io.StringIO()
    try:
        with _launched(world), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            _start(entry, argv, monkeypatch)
    except SystemExit as e:
        result.code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Reached:
        result.reached = True
    finally:
        torch.set_num_threads(threads)  # entry points pin their threads to the cores they share
    result.out, result.err = out.getvalue(), err.getvalue()
    return result


@contextlib.contextmanager
def _launched(world: int):
    """The launcher's variables as a job of ``world`` ranks (this process rank 0) would see them,
    for the run only: the enclosing job's (``mpirun -n 2 pytest``) are back before pytest reports."""
    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith(LAUNCHER)}
    if world > 1:
        os.environ.update(PMI_RANK="0", PMI_SIZE=str(world), MPI_LOCALRANKID="0", MPI_LOCALNRANKS=str(world))
    try:
        yield
    finally:
        for name in [n for n in os.environ if n.startswith(LAUNCHER)]:
            del os.environ[name]
        os.environ.update(saved)


def _start(entry: str, argv: list[str], monkeypatch) -> None:
    if entry.startswith("examples/"):
        path = str(ROOT / entry)
        monkeypatch.setattr(sys, "argv", [path, *argv])
        runpy.run_path(path, run_name="__main__")
    elif entry.startswith("mpi-sgd"):
        from mpi_sgd.cli import main

        raise SystemExit(main([*commands()[entry], *argv]))
    else:
        module, function = MODULES[entry.removeprefix("python -m ")].split(":")
        raise SystemExit(getattr(importlib.import_module(module), function)(argv))


def flags_of(entry: str, monkeypatch) -> dict[str, argparse.Action]:
    """The flags ``entry`` accepts, from its parser: '--lr' -> its action (positionals by name)."""
    got = {}
    original = argparse.ArgumentParser.parse_args

    def capture(self, args=None, namespace=None):
        got["parser"] = self
        raise Reached("parse_args")

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    run(entry, [], monkeypatch)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", original)
    if "parser" not in got:
        return {}  # no parser: positional arguments only (the host probe's names)
    parser = got["parser"]
    if entry.startswith("mpi-sgd"):  # the command's own parser, under mpi-sgd's
        for name in commands()[entry]:
            parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    flags = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        flags[longs[0] if longs else action.dest] = action
    return flags
