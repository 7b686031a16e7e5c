"""How a flag probe finds where a value went, and the stand-ins its runs use.

A probe (:class:`Probe`) runs an entry point (:mod:`tests.entry_points`) with one flag set to a
value other than its default and checks: the call that consumes it (:class:`at`: a library call
and the argument it received), what the run printed (:class:`prints`), or, for an ``mpi-sgd``
command, the configuration it runs with (:class:`configured`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

TRAIN = "mpi_sgd.trainer.Trainer.from_config"
PREPARE, LOAD, MLP = "mpi_sgd.data.prepare", "mpi_sgd.data.load", "mpi_sgd.models.MLP"
WRITE = "mpi_sgd.report.write_json"
SERVER = "mpi_sgd.paramserver.train"
PS_MAIN = "mpi_sgd.paramserver.__main__"
FAKE = "tests.flag_checks"


class FakeTrainer:
    """What ``Trainer.from_config`` hands back in these runs: the calls a script makes, no training."""

    step = 0

    def load_checkpoint(self, path, auto=False, given=frozenset()):
        return path

    def train(self):
        return {"steps": 1, "summary": {"t_comp": 0.0, "t_sync": 0.0}}

    def timeline(self):
        return {"traceEvents": []}


class FakeCluster:
    """Two hosts that are never made: the netns module's view of them, for its flags."""

    hosts, address, tag = ("a", "b"), {"a": "10.0.0.1", "b": "10.0.0.2"}, "test"

    def __init__(self, hosts, rate=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def counters(self, host):
        return 0, 0

    def popen(self, command):
        raise AssertionError("recorded and stopped before this")

    def leftovers(self):
        return []


def two_steps(args, original):
    """Trainer.train as a stand-in: two steps taken, so a caller counting gradients has some."""
    args["self"].step = 2
    return {}


def first_batch(args, original):
    """data.rank_batches cut to its first step: an epoch of training in one step."""
    return original(**args)[:1]


# -- what a probe checks --------------------------------------------------------------------------
def _value(record: dict, path: str):
    name, *attrs = path.split(".")
    value = record[name]
    for attr in attrs:
        value = getattr(value, attr)
    return value


def _same(value, want) -> bool:
    if callable(want) and not isinstance(want, type):
        return bool(want(value))
    if isinstance(want, torch.Tensor):
        return torch.equal(value, want)
    return value == want


@dataclass
class at:
    """Some call to ``target`` received ``path`` (an argument, or an attribute of one) equal to ``want``."""

    target: str
    path: str
    want: object

    def __call__(self, r) -> None:
        seen = [_value(c, self.path) for c in r.called(self.target)]
        assert any(_same(v, self.want) for v in seen), f"{self.target}: {self.path} was {seen}, want {self.want}"


@dataclass
class prints:
    pattern: str
    target = None

    def __call__(self, r) -> None:
        assert re.search(self.pattern, r.out, re.M), f"{self.pattern!r} not in output:\n{r.out[-3000:]}"


@dataclass
class configured:
    """The configuration the command's function is handed has ``field`` equal to ``want``."""

    field: str
    want: object
    target = None

    def __call__(self, r) -> None:
        assert r.built, "no configuration built"
        assert _same(getattr(r.built[-1], self.field), self.want), (self.field, r.built[-1])


@dataclass
class never:
    target: str

    def __call__(self, r) -> None:
        assert not r.called(self.target), f"{self.target} was called"


@dataclass
class Probe:
    argv: list  # the flag and its value; "{tmp}" stands for a fresh folder
    checks: tuple
    base: bool = True  # after the entry point's own base arguments
    world: int = 1  # the job size the launcher announces


def probe(argv, *checks, base=True, world=1) -> Probe:
    return Probe(argv if isinstance(argv, list) else argv.split(), checks, base, world)


@dataclass
class Entry:
    base: list  # arguments every probe of this entry point starts from
    recorders: dict  # target -> what its recorder does: 'pass', 'stop' or f(arguments, original)
    probes: dict  # flag -> Probe


def _argv(flag: str, text: str | None) -> list[str]:
    """'--rounds', '3' -> ['--rounds', '3']; a flag that takes no value, or its --no- form, alone."""
    if text is None:
        return [flag]
    return text.split() if text.startswith("--") else [flag, *text.split()]


# The command's function is not run: its flags are built and the run ends there.
BUILD_ONLY = {
    "mpi_sgd.cli.run_command": lambda a, _: a["namespace"].parser.build(a["namespace"].flags, a["namespace"]) and 0
}


def command(**flags) -> Entry:
    """An ``mpi-sgd`` command, each flag probed by the configuration it builds: name=(text, want)."""
    flags = {"out_dir": ("somewhere", "somewhere"), "plot": ("--no-plot", False)} | flags
    return Entry(
        [],
        BUILD_ONLY,
        {
            "--" + name.replace("_", "-"): probe(_argv("--" + name.replace("_", "-"), text), configured(name, want))
            for name, (text, want) in flags.items()
        },
    )


def numel(n):
    return lambda t: t.numel() == n


def configs(target: str, prefix: str, **values) -> dict:
    """'--name': probe(value) checked at ``target``'s ``prefix.name``, for flags that differ by name only."""
    out = {}
    for name, (text, want) in values.items():
        flag = "--" + name.replace("_", "-")
        out[flag] = probe(_argv(flag, text), at(target, f"{prefix}.{name}" if prefix else name, want))
    return out


SERVERS_OWN = dict(  # the parameter server's flags, and what each is set to in its probe
    max_staleness=("2", 2),
    lr_by_staleness=(None, True),
    worker_timeout=("20", 20.0),
    server_timeout=("9", 9.0),
    heartbeat=("0.5", 0.5),
    straggler_ms=("5", 5.0),
    straggler_rank=("0", 0),
)
