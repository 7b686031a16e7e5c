"""Every flag of every entry point changes something: each is run and its effect checked.

The entry points (examples, ``mpi-sgd`` commands, ``python -m`` modules) are found from the tree
and their flags read from their own parsers, so a new entry point or flag without a line in
``PROBES`` fails here. A probe runs the entry point in this process (:mod:`tests.entry_points`)
with the flag set to a value other than its default and checks where that value went: the call
that consumes it (``at``: a library call and the argument it received), what the run printed
(``prints``), or, for an ``mpi-sgd`` command, the configuration its benchmark runs with
(``configured``), which ``test_every_command_flag_is_read`` also finds read by that command.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, fields

import pytest
import torch

from mpi_sgd.perfmodel import PRESETS
from tests.entry_points import entry_points, flags_of, run

TRAIN = "mpi_sgd.trainer.Trainer.from_config"
PREPARE, LOAD, MLP = "mpi_sgd.data.prepare", "mpi_sgd.data.load", "mpi_sgd.models.MLP"
WRITE = "mpi_sgd.report.write_json"
SERVER = "mpi_sgd.paramserver.train"
PS_MAIN = "mpi_sgd.paramserver.__main__"
FAKE = "tests.unit.test_every_flag"


class FakeTrainer:
    """What ``Trainer.from_config`` hands back in these runs: the calls a script makes, no training."""

    step = 0

    def load_checkpoint(self, path, auto=False):
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


SEED5 = torch.randn(10, generator=torch.Generator().manual_seed(5))

PROBES = {
    "examples/01_hello.py": Entry([], {}, {"--backend": probe("--backend local", at("init", "backend", "local"))}),
    "examples/02_p2p.py": Entry(
        [],
        {},
        {
            "--backend": probe("--backend local", at("init", "backend", "local")),
            "--length": probe("--length 7", at("comm.isend", "buf", numel(7))),
        },
    ),
    "examples/03_collectives.py": Entry(
        [], {}, {"--backend": probe("--backend local", at("init", "backend", "local"))}
    ),
    "examples/04_ring_allreduce.py": Entry(
        ["--length", "10", "--iterations", "1"],
        {"mpi_sgd.timing.time_interleaved": "pass"},
        {
            "--length": probe("--length 11", at("comm.allreduce", "buf", numel(11))),
            "--dtype": probe("--dtype int32", at("comm.allreduce", "buf", lambda t: t.dtype == torch.int32)),
            "--iterations": probe("--iterations 3", at("mpi_sgd.timing.time_interleaved", "iterations", 3)),
            "--seed": probe("--seed 5", at("comm.allreduce", "buf", SEED5)),  # rank 0 draws with seed + 0
        },
    ),
    "examples/05_sgd_by_hand.py": Entry(
        ["--epochs", "1"],
        {"mpi_sgd.data.rank_batches": first_batch, "torch.optim.SGD": "pass"},
        {
            "--batch-size": probe("--batch-size 8", at("mpi_sgd.data.rank_batches", "batch_size", 8)),
            "--epochs": probe("--epochs 2", at("mpi_sgd.data.rank_batches", "epoch", 1)),
            "--lr": probe("--lr 0.01", at("torch.optim.SGD", "lr", 0.01)),
            "--seed": probe("--seed 3", at("mpi_sgd.data.rank_batches", "seed", 3)),
        },
    ),
    "examples/sync_sgd.py": Entry(
        [],
        {TRAIN: lambda a, _: FakeTrainer(), WRITE: lambda a, _: a["path"], PREPARE: "pass"},
        {
            **configs(
                TRAIN,
                "cfg",
                model=("mlp", "mlp"),
                epochs=("3", 3),
                batch_size=("8", 8),
                grad_accum=("2", 2),
                lr=("0.01", 0.01),
                momentum=("0.5", 0.5),
                optimizer=("adam", "adam"),
                strategy=("flat", "flat"),
                bucket_mb=("2", 2.0),
                zero=("2", 2),
                amp=("bf16", "bf16"),
                compress=("fp16", "fp16"),
                max_steps=("5", 5),
                keep_checkpoints=("1", 1),
                on_nonfinite=("skip", "skip"),
                check_every=("7", 7),
                progress=(None, True),
            ),
            "--dataset": probe("--dataset blobs", at(PREPARE, "name", "blobs")),
            "--val-fraction": probe("--val-fraction 0.25", at(PREPARE, "val_fraction", 0.25)),
            "--seed": probe("--seed 7", at(PREPARE, "seed", 7), at(TRAIN, "cfg.seed", 7)),
            "--device": probe("--device cpu:0", at("mpi_sgd.comm.gpu.local_device", "name", "cpu:0")),
            "--backend": probe("--backend local", at("init", "backend", "local")),
            "--dtype": probe("--dtype float64", at(TRAIN, "dataset.x.dtype", torch.float64)),
            "--checkpoint": probe("--checkpoint {tmp}/ck", at(TRAIN, "cfg.checkpoint", lambda p: p.endswith("/ck"))),
            "--resume": probe(
                "--resume {tmp}", at(f"{FAKE}.FakeTrainer.load_checkpoint", "path", lambda p: p.startswith("/"))
            ),
            "--metrics-json": probe("--metrics-json {tmp}/m.json", at(WRITE, "path", lambda p: p.endswith("m.json"))),
            "--timeline": probe(
                "--timeline {tmp}/t.json",
                at(WRITE, "path", lambda p: p.endswith("t.json")),
                at(TRAIN, "cfg.timeline", lambda p: p is not None),
            ),
            "--stall-timeout": probe("--stall-timeout 7", at("init", "stall_timeout", 7.0)),
            "--stall-abort": probe("--stall-abort 9", at("init", "stall_abort", 9.0)),
        },
    ),
}

DIST = "torch.distributed."
PROBES |= {
    "examples/torch_ddp_over_mpi.py": Entry(
        ["--epochs", "1"],
        {  # torch.distributed as one process: no group, nothing to reduce
            DIST + "init_process_group": lambda a, _: None,
            DIST + "get_rank": lambda a, _: 0,
            DIST + "get_world_size": lambda a, _: 1,
            DIST + "all_reduce": lambda a, _: None,
            DIST + "all_gather": lambda a, _: [t.copy_(a["tensor"]) for t in a["tensor_list"]] and None,
            DIST + "destroy_process_group": lambda a, _: None,
            "torch.nn.parallel.DistributedDataParallel": lambda a, _: a["module"],
            "torch.utils.data.DataLoader": "pass",
            "torch.optim.SGD": "pass",
        },
        {
            "--backend": probe("--backend gloo", at(DIST + "init_process_group", "backend", "gloo")),
            "--epochs": probe("--epochs 2", prints(r"^epoch 1 ")),
            "--batch-size": probe("--batch-size 512", at("torch.utils.data.DataLoader", "batch_size", 512)),
            "--lr": probe("--lr 0.01", at("torch.optim.SGD", "lr", 0.01)),
        },
    ),
    "examples/07_zero.py": Entry(
        ["--layers", "4,8,1", "--steps", "2", "--batch-size", "2"],
        {MLP: "pass"},
        {
            "--layers": probe("--layers 4,6,1", at(MLP, "sizes", (4, 6, 1))),
            "--steps": probe("--steps 3", prints(r"3 steps of batch 1x2")),
            "--batch-size": probe("--batch-size 3", prints(r"steps of batch 1x3")),
            "--optimizer": probe("--optimizer sgd", prints(r", sgd, 2 steps")),
            "--backend": probe("--backend local", at("init", "backend", "local")),
        },
    ),
    "examples/08_pipeline.py": Entry(
        ["--width", "4", "--steps", "1", "--batch-size", "8"],
        {MLP: "pass", "mpi_sgd.pipeline.cut": "pass", "mpi_sgd.pipeline.PipelineStage.forward_backward": "pass"},
        {
            "--schedule": probe("--schedule gpipe", prints(r"\bgpipe, m = 4")),
            "--micro-batches": probe("--micro-batches 2", prints(r"m = 2: parameters")),
            "--split": probe("--split params", at("mpi_sgd.pipeline.cut", "by", "params")),
            "--steps": probe("--steps 2", prints(r"after 2 steps")),
            "--batch-size": probe(
                "--batch-size 16", at("mpi_sgd.pipeline.PipelineStage.forward_backward", "x", numel(16 * 32))
            ),
            "--width": probe("--width 6", at(MLP, "sizes", (32, 6, 6, 6, 6, 6, 10))),
            "--timeline": probe("--timeline {tmp}/t.json", at(WRITE, "path", lambda p: p.endswith("t.json"))),
        },
    ),
}

TRAINER = "mpi_sgd.trainer.Trainer.train"
SERVERS_OWN = dict(  # the parameter server's flags, and what each is set to in its probe
    max_staleness=("2", 2),
    lr_by_staleness=(None, True),
    worker_timeout=("20", 20.0),
    server_timeout=("9", 9.0),
    heartbeat=("0.5", 0.5),
    straggler_ms=("5", 5.0),
    straggler_rank=("0", 0),
)
PROBES["examples/09_parameter_server.py"] = Entry(
    ["--epochs", "1"],
    {TRAINER: two_steps, SERVER: "stop", LOAD: "pass", "mpi_sgd.models.build_model": "pass"},
    {
        "--model": probe("--model mlp", at("mpi_sgd.models.build_model", "name", "mlp")),
        "--dataset": probe("--dataset blobs", at(LOAD, "name", "blobs")),
        "--epochs": probe("--epochs 3", at(TRAINER, "self.cfg.epochs", 3)),
        "--batch-size": probe(
            "--batch-size 16", at(TRAINER, "self.cfg.batch_size", 16), at(SERVER, "cfg.batch_size", 16)
        ),
        # one rank: the asynchronous run's lr / R is lr itself
        "--lr": probe("--lr 0.2", at(TRAINER, "self.cfg.lr", 0.2), at(SERVER, "cfg.lr", 0.2)),
        "--momentum": probe("--momentum 0.5", at(TRAINER, "self.cfg.momentum", 0.5), at(SERVER, "cfg.momentum", 0.5)),
        "--strategy": probe("--strategy flat", at("mpi_sgd.gradsync.make", "strategy", "flat")),
        "--bucket-mb": probe("--bucket-mb 2", at("mpi_sgd.gradsync.make", "bucket_mb", 2.0)),
        "--seed": probe("--seed 3", at(LOAD, "seed", 3), at(SERVER, "cfg.seed", 3)),
        "--dtype": probe("--dtype float64", at(SERVER, "dataset.x.dtype", torch.float64)),
        "--stall-timeout": probe("--stall-timeout 7", at("init", "stall_timeout", 7.0)),
        "--stall-abort": probe("--stall-abort 9", at("init", "stall_abort", 9.0)),
        "--progress": probe("--progress", at(TRAINER, "self.cfg.progress", True)),
        "--servers": probe("--servers 2", at(SERVER, "cfg.servers", 2), world=3),
        **configs(SERVER, "cfg", **SERVERS_OWN),
    },
)

CALIBRATE = "mpi_sgd.calibrate.run_calibration"
NET = ["--t-comp", "1", "--params", "1M"]  # an alpha-beta cost, with --network or --alpha/--beta
PROBES["examples/speedup.py"] = Entry(
    ["--t-comp", "1", "--t-sync", "1"],
    {CALIBRATE: "stop", "mpi_sgd.perfmodel.plot_scaling": lambda a, _: a["path"], "mpi_sgd.perfmodel.Network": "pass"},
    {
        "--t-comp": probe("--t-comp 0.5", prints(r"^T_comp = 0.5 s at batch 64")),
        "--t-sync": probe("--t-sync 0.25", prints(r"T_sync = 0.25 s at every R > 1")),
        "--calibration": probe(
            ["--calibration", "{tmp}/c.json", "--t-sync", "1"], prints(r"^T_comp = 0.01 s at batch 64"), base=False
        ),
        "--calibrate": probe("--calibrate", at(CALIBRATE, "need_network", False)),
        "--save": probe("--calibrate --save {tmp}/c.json", at(CALIBRATE, "save", lambda p: p.name == "c.json")),
        "--max-bytes": probe("--calibrate --max-bytes 1MiB", at(CALIBRATE, "max_bytes", 1 << 20)),
        "--layers": probe("--calibrate --layers 8,4", at(CALIBRATE, "layers", [8, 4])),
        "--alpha": probe(
            [*NET, "--alpha", "2e-6", "--beta", "1e-9"], at("mpi_sgd.perfmodel.Network", "alpha", 2e-6), base=False
        ),
        "--beta": probe(
            [*NET, "--alpha", "2e-6", "--beta", "1e-9"], at("mpi_sgd.perfmodel.Network", "beta", 1e-9), base=False
        ),
        "--gamma": probe(
            [*NET, "--alpha", "1e-6", "--beta", "1e-9", "--gamma", "1e-10"],
            at("mpi_sgd.perfmodel.Network", "gamma", 1e-10),
            base=False,
        ),
        "--network": probe([*NET, "--network", "ib100"], prints(re.escape(PRESETS["ib100"].describe())), base=False),
        "--params": probe(
            ["--t-comp", "1", "--network", "ib100", "--params", "25M"], prints(r"of 100,000,000 bytes"), base=False
        ),
        "--algorithm": probe(
            [*NET, "--network", "ib100", "--algorithm", "rabenseifner"],
            prints(r"rabenseifner all-reduce of"),
            base=False,
        ),
        "--ranks": probe("--ranks 1,3", prints(r"^\| +3 \|")),
        "--samples": probe("--samples 1000", prints(r"^N = 1000 samples")),
        "--batch-size": probe("--batch-size 32", prints(r"B = 32 \(weak")),
        "--scaling": probe("--scaling strong --ranks 1,2", prints(r"\(strong scaling\)")),
        "--plot": probe(
            "--plot {tmp}/s.png", at("mpi_sgd.perfmodel.plot_scaling", "path", lambda p: p.name == "s.png")
        ),
    },
)

PROBLEM = "mpi_sgd.guide.Problem"
PROBES["examples/which_strategy.py"] = Entry(
    ["--params", "1M", "--memory", "1GiB", "--ranks", "4", "--network", "10gbe"],
    {PROBLEM: "pass"},
    {
        **configs(
            PROBLEM,
            "",
            params=("25M", 25_000_000),
            memory=("2GiB", 2 << 30),
            ranks=("8", 8),
            optimizer=("adam", "adam"),
            t_comp=("0.01", 0.01),
            servers=("2", 2),
            micro_batches=("4", 4),
            boundary_bytes=("1MiB", 1 << 20),
        ),
        "--network": probe("--network ib100", at(PROBLEM, "network", PRESETS["ib100"])),
        "--alpha": probe(
            "--params 1M --memory 1GiB --ranks 4 --alpha 2e-6 --beta 1e-9",
            at(PROBLEM, "network.alpha", 2e-6),
            base=False,
        ),
        "--beta": probe(
            "--params 1M --memory 1GiB --ranks 4 --alpha 2e-6 --beta 1e-9",
            at(PROBLEM, "network.beta", 1e-9),
            base=False,
        ),
        "--slowdown": probe("--t-comp 0.01 --slowdown 2", at(PROBLEM, "slowdown", 2.0)),
    },
)
PROBES["examples/will_it_fit.py"] = Entry(
    ["--ranks", "8"],
    {},
    {
        "--params": probe("--params 25.6e6", prints(r"^Ψ = 25,600,000 parameters")),
        "--optimizer": probe("--optimizer momentum", prints(r"B momentum state each")),
        "--precision": probe("--precision mixed", prints(r"^Ψ = [\d,]+ parameters, mixed:")),
        "--ranks": probe("--ranks 3", prints(r"^\| +3 \|")),
        "--memory": probe("--memory 16GiB", prints(r"16 GiB per rank")),
    },
)

PROBES |= {
    "mpi-sgd bench allreduce": command(
        min_bytes=("8", 8),
        max_bytes=("1MiB", 1 << 20),
        impls=("raw,ring", ["raw", "ring"]),
        iterations=("3", 3),
        warmup=("0", 0),
        rounds=("2", 2),
        detail=(None, True),
    ),
    "mpi-sgd bench async": command(
        scenarios=("comm", ["comm"]),
        ranks=("3,2", [2, 3]),
        evaluations=("60", 60),
        lr=("0.2", 0.2),
        straggler_ms=("5", 5.0),
        rounds=("1", 1),
        seed=("3", 3),
    ),
    "mpi-sgd bench grid": command(
        models=("1x8", [(1, 8)]),
        samples=("64", [64]),
        batch_size=("8", 8),
        epochs=("2", 2),
        repeats=("1", 1),
        threads=("2", 2),
        tiny=(None, True),
    ),
    "mpi-sgd bench pipeline": command(
        width=("8", 8),
        depth=("3", 3),
        batch_size=("16", 16),
        micro_batches=("1,2", [1, 2]),
        schedules=("gpipe", ["gpipe"]),
        split=("layers", "layers"),
        steps=("1", 1),
        rounds=("1", 1),
        warmup=("0", 0),
        timeline_m=("2", 2),
        seed=("3", 3),
    ),
    "mpi-sgd bench sgd": command(
        models=("mlp", ["mlp"]),
        variants=("local,flat", ["local", "flat"]),
        batch_size=("8", 8),
        bucket_mb=("0.5,2", [0.5, 2.0]),
        rounds=("2", 2),
        steps_per_round=("3", 3),
        warmup=("0", 0),
        seed=("3", 3),
        backend=("gloo", "gloo"),
        device=("cpu:0", "cpu:0"),
    ),
    "mpi-sgd bench shm": command(
        min_bytes=("8", 8),
        max_bytes=("1MiB", 1 << 20),
        impls=("raw,shared", ["raw", "shared"]),
        pool=("4MiB", 4 << 20),
        rounds=("2", 2),
        iterations=("3", 3),
    ),
    "mpi-sgd bench validate": command(
        batches=("2,64", [2, 64]),
        ranks=("1,2", [1, 2]),
        max_steps=("20", 20),
        repeats=("1", 1),
        max_bytes=("1MiB", 1 << 20),
        transport=("shm", "shm"),
    ),
    "mpi-sgd bench workers": command(
        workers=("2", [2]),
        max_bytes=("10MB", 10 << 20),
        backends=("mpi4py", ["mpi4py"]),
        warmup=("0", 0),
        iterations=("2", 2),
    ),
    "mpi-sgd bench zero": command(
        layers=("8,8,1", [8, 8, 1]),
        optimizer=("sgd", "sgd"),
        batch_size=("4", 4),
        variants=("dp,zero1", ["dp", "zero1"]),
        bucket_mb=("2", 2.0),
        steps=("1", 1),
        rounds=("1", 1),
        warmup=("0", 0),
        seed=("3", 3),
    ),
}

DOCTOR = "mpi_sgd.cluster.doctor.run"
PROBES["mpi-sgd doctor"] = Entry(
    [],
    {DOCTOR: "stop"},
    {
        "--hosts": probe("--hosts a:2,b", at(DOCTOR, "names", ["a", "b"])),
        "--hostfile": probe("--hostfile {tmp}/hosts", at(DOCTOR, "names", ["x", "y"])),  # written by the test
        "--timeout": probe("--timeout 3", at(DOCTOR, "timeout", 3.0)),
        "--python": probe("--python /opt/py", at(DOCTOR, "python", "/opt/py")),
    },
)
FAULTS = "mpi_sgd.faultmatrix."
PROBES["mpi-sgd faults"] = Entry(
    ["--script", "train.py"],
    {FAULTS + "run": lambda a, _: [], FAULTS + "run_drill": "stop"},
    {
        "--script": probe("--script other.py", at(FAULTS + "run", "script", "other.py")),
        "--stall-timeout": probe("--stall-timeout 5", at(FAULTS + "run", "stall_timeout", 5.0)),
        "--only": probe(
            "--only stalls", at(FAULTS + "run", "cases", lambda cs: [c.name for c in cs] == ["rank 1 stalls"])
        ),
        "--drills": probe("--no-drills", at(FAULTS + "run", "script", "train.py"), never(FAULTS + "run_drill")),
    },
)
PROBES["python -m mpi_sgd.paramserver"] = Entry(
    [],
    {f"{PS_MAIN}.train": "stop", f"{PS_MAIN}.build_model": "pass", f"{PS_MAIN}.ExitAfter": "pass", LOAD: "pass"},
    {
        "--model": probe("--model mlp", at(f"{PS_MAIN}.build_model", "name", "mlp")),
        "--dataset": probe("--dataset blobs", at(LOAD, "name", "blobs")),
        # a drill needs a job of two or more: the launcher says two, this process is rank 0
        "--exit-rank": probe("--exit-rank 0", at(f"{PS_MAIN}.ExitAfter", "sends", 10), world=2),
        "--exit-after": probe("--exit-rank 0 --exit-after 5", at(f"{PS_MAIN}.ExitAfter", "sends", 5), world=2),
        "--servers": probe("--servers 2", at(f"{PS_MAIN}.train", "cfg.servers", 2), world=3),
        **configs(
            f"{PS_MAIN}.train",
            "cfg",
            lr=("0.2", 0.2),
            momentum=("0.5", 0.5),
            batch_size=("16", 16),
            evaluations=("50", 50),
            seed=("3", 3),
            **SERVERS_OWN,
        ),
    },
)
RUN_CALIBRATION = "mpi_sgd.calibrate.run.run_calibration"
PROBES["python -m mpi_sgd.calibrate"] = Entry(
    ["--save", "c.json"],
    {RUN_CALIBRATION: "stop"},
    {
        "--save": probe("--save {tmp}/d.json", at(RUN_CALIBRATION, "save", lambda p: p.name == "d.json")),
        "--max-bytes": probe("--max-bytes 1MiB", at(RUN_CALIBRATION, "max_bytes", 1 << 20)),
        "--layers": probe("--layers 8,4", at(RUN_CALIBRATION, "layers", [8, 4])),
        "--batch-size": probe("--batch-size 8", at(RUN_CALIBRATION, "batch_size", 8)),
        "--algorithm": probe("--algorithm rabenseifner", at(RUN_CALIBRATION, "algorithm", "rabenseifner")),
        "--strategy": probe("--strategy bucketed", at(RUN_CALIBRATION, "strategy", "bucketed")),
    },
)
VALIDATE_WRITE = "mpi_sgd.bench.validate.write_json"
PROBES["python -m mpi_sgd.bench.validate"] = Entry(
    ["--metrics-json", "m.json"],
    {TRAIN: lambda a, _: FakeTrainer(), VALIDATE_WRITE: lambda a, _: a["path"], LOAD: "pass"},
    {
        **configs(
            TRAIN,
            "cfg",
            model=("mlp", "mlp"),
            epochs=("3", 3),
            batch_size=("8", 8),
            strategy=("naive", "naive"),
            max_steps=("5", 5),
            progress=(None, True),
        ),
        "--dataset": probe("--dataset blobs", at(LOAD, "name", "blobs")),
        "--metrics-json": probe("--metrics-json other.json", at(VALIDATE_WRITE, "path", "other.json")),
    },
)
NETNS = "mpi_sgd.cluster.netns."
PROBES["python -m mpi_sgd.cluster.netns"] = Entry(
    ["--", "true"],
    {
        NETNS + "missing": lambda a, _: None,
        NETNS + "Cluster": lambda a, _: FakeCluster(a["hosts"]),
        NETNS + "signal.signal": lambda a, _: None,  # the handlers of this test process stay as they are
        f"{FAKE}.FakeCluster.popen": "stop",
    },
    {
        "--hosts": probe(["--hosts", "x,y", "--", "true"], at(NETNS + "Cluster", "hosts", ("x", "y")), base=False),
        "--rate": probe(["--rate", "1gbit", "--", "true"], at(NETNS + "Cluster", "rate", "1gbit"), base=False),
        "command": probe(["--", "echo", "hi"], at(f"{FAKE}.FakeCluster.popen", "command", ["echo", "hi"]), base=False),
    },
)
PROBES["python -m mpi_sgd.cluster.probe"] = Entry([], {}, {})  # host names, as positional arguments; no flags


# -- the tests --------------------------------------------------------------------------------------
def write_inputs(tmp_path) -> None:
    """The files some probes read: a calibration (speedup --calibration) and a hostfile (doctor)."""
    from mpi_sgd import perfmodel as pm
    from mpi_sgd.calibrate import Calibration, StepTiming, SweepPoint

    cal = Calibration(pm.Network(1e-6, 1e-10), "ring", StepTiming(0.01, 64, 1000, "mlp"), (SweepPoint(4, 2, 1, 1, 1),))
    cal.save(tmp_path / "c.json")
    (tmp_path / "hosts").write_text("x:2\ny:1\n")


def test_every_entry_point_has_probes():
    assert sorted(PROBES) == sorted(entry_points()), "an entry point without probes here, or probes of one gone"


@pytest.mark.parametrize("entry", entry_points())
def test_every_flag_has_a_probe_and_help(entry, monkeypatch):
    flags = flags_of(entry, monkeypatch)
    unprobed, gone = set(flags) - set(PROBES[entry].probes), set(PROBES[entry].probes) - set(flags)
    assert not unprobed and not gone, f"{entry}: flags without a probe {sorted(unprobed)}; gone {sorted(gone)}"
    assert all(action.help for action in flags.values()), f"{entry}: a flag without help"


CASES = [(entry, flag) for entry, spec in PROBES.items() for flag in spec.probes]


@pytest.mark.parametrize("entry, flag", CASES, ids=[f"{e} {f}" for e, f in CASES])
def test_flag_reaches_what_it_controls(entry, flag, monkeypatch, tmp_path):
    spec, p = PROBES[entry], PROBES[entry].probes[flag]
    write_inputs(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in [*(spec.base if p.base else []), *p.argv]]
    recorders = dict(spec.recorders)
    for check in p.checks:  # a call a check looks at is recorded, and made as usual
        target = getattr(check, "target", None)
        if target and target != "init" and not target.startswith("comm.") and target not in recorders:
            recorders[target] = "pass"
    monkeypatch.chdir(tmp_path)  # anything an entry point writes by default lands here
    r = run(entry, argv, monkeypatch, recorders, p.world)
    assert r.code in (None, 0), f"{entry} {' '.join(argv)} exited {r.code}:\n{r.err[-3000:]}"
    for check in p.checks:
        check(r)


def _reads(module, names: set[str], skip: ast.ClassDef | None) -> set[str]:
    tree = ast.parse(inspect.getsource(module))
    inside = {id(n) for n in ast.walk(skip)} if skip else set()
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in names and id(n) not in inside}


@pytest.mark.parametrize("entry", [e for e, spec in PROBES.items() if spec.recorders is BUILD_ONLY])
def test_every_command_flag_is_read(entry, monkeypatch):
    """The configuration a probe saw must also be used: each field is read by the module that declares it."""
    import sys

    built = run(entry, [], monkeypatch, BUILD_ONLY).built[-1]
    for owner in type(built).__mro__:
        declared = set(owner.__dict__.get("__annotations__", {})) & {f.name for f in fields(built)}
        if not declared:
            continue
        module = sys.modules[owner.__module__]
        body = next(
            n for n in ast.walk(ast.parse(inspect.getsource(module))) if getattr(n, "name", None) == owner.__name__
        )
        unread = declared - _reads(module, declared, body)
        assert not unread, f"{entry}: {owner.__module__} never reads {sorted(unread)}"


# A flag whose value would change nothing beside the others given is refused, in one line.
REFUSED = [
    ("examples/speedup.py", "--t-comp 1 --t-sync 1 --network ib100", "--t-sync is T_sync itself"),
    ("examples/speedup.py", "--t-comp 1 --t-sync 1 --save {tmp}/c2.json", "go with --calibrate"),
    ("examples/speedup.py", "--t-comp 1 --t-sync 1 --max-bytes 1MiB", "go with --calibrate"),
    ("examples/speedup.py", "--t-comp 1 --params 1M --network ib100 --alpha 1e-6 --beta 1e-9", "give --network, or"),
    ("examples/speedup.py", "--t-comp 1 --params 1M --network ib100 --gamma 1e-9", "--gamma goes with --alpha"),
    ("examples/speedup.py", "--calibration {tmp}/c.json --t-comp 1 --t-sync 1", "--calibration would go unused"),
    (
        "examples/which_strategy.py",
        "--params 1M --memory 1GiB --ranks 4 --network 10gbe --alpha 1e-6 --beta 1e-9",
        "give",
    ),
    (
        "examples/which_strategy.py",
        "--params 1M --memory 1GiB --ranks 4 --network 10gbe --slowdown 2",
        "--slowdown scales",
    ),
    ("python -m mpi_sgd.paramserver", "--exit-rank 0", "one process sends no messages"),
    ("python -m mpi_sgd.bench.validate", "--model mlp", "--metrics-json is where the root writes"),
    ("mpi-sgd doctor", "--hosts a --hostfile {tmp}/hosts", "give --hosts or --hostfile, not both"),
    ("python -m mpi_sgd.cluster.netns", "--hosts a,b --", "give the command to run after --"),
]


@pytest.mark.parametrize("entry, argv, message", REFUSED, ids=[f"{e} {a}" for e, a, _ in REFUSED])
def test_a_flag_that_would_change_nothing_is_refused(entry, argv, message, monkeypatch, tmp_path):
    write_inputs(tmp_path)
    r = run(entry, argv.replace("{tmp}", str(tmp_path)).split(), monkeypatch)
    assert r.code == 2 and message in r.err, (r.code, r.err[-2000:])
    assert not r.called("init"), "refused only after communication started"
