"""The probes of the flags of ``mpi-sgd``'s commands and of the modules ``python -m`` runs."""

from __future__ import annotations

from tests.flag_checks import (
    FAKE,
    LOAD,
    PS_MAIN,
    SERVERS_OWN,
    TRAIN,
    WRITE,
    Entry,
    FakeCluster,
    FakeTrainer,
    at,
    command,
    configs,
    never,
    probe,
)

PROBES = {
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
    "mpi-sgd bench ddp": command(
        models=("simplenet", ["simplenet"]),
        batch_size=("8", 8),
        rounds=("2", 2),
        steps_per_round=("3", 3),
        warmup=("0", 0),
        bucket_view=(None, True),
        seed=("3", 3),
    ),
    "mpi-sgd bench goodput": command(
        batch=("4", 4),
        multiples=("1,2", [1, 2]),
        seeds=("2", 2),
        lrs=("0.1,0.2", [0.1, 0.2]),
        rule=("linear", "linear"),
        target_val_loss=("0.5", 0.5),
        max_steps=("100", 100),
        eval_every=("2", 2),
        ranks=("1,2", [1, 2]),
        transports=("shm", ["shm"]),
        job_repeats=("2", 2),
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
CLEAN = "mpi_sgd.cluster.residue.clean"
PROBES["mpi-sgd doctor"] = Entry(
    [],
    {DOCTOR: "stop", CLEAN: "stop"},
    {
        "--hosts": probe("--hosts a:2,b", at(DOCTOR, "names", ["a", "b"])),
        "--hostfile": probe("--hostfile {tmp}/hosts", at(DOCTOR, "names", ["x", "y"])),  # written by the test
        "--timeout": probe("--timeout 3", at(DOCTOR, "timeout", 3.0)),
        "--python": probe("--python /opt/py", at(DOCTOR, "python", "/opt/py")),
        "--clean": probe("--clean --timeout 5", at(CLEAN, "grace", 5.0), never(DOCTOR)),
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
        "--t-comp-only": probe("--t-comp-only", at(RUN_CALIBRATION, "t_comp_only", True)),
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
            lr=("0.2", 0.2),
            seed=("3", 3),
            target_val_loss=("0.5", 0.5),
            check_every=("7", 7),
        ),
        "--eval-every": probe("--eval-every 5 --target-val-loss 0.5", at(TRAIN, "cfg.eval_every", 5)),
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
FIG = "mpi_sgd.figures.run."
PROBES["mpi-sgd figures"] = Entry(
    ["ring-allreduce"],
    {FIG + "make": "stop", FIG + "draw": "stop", FIG + "finished": lambda a, _: True},
    {
        "names": probe(["zero-memory"], at(FIG + "make", "figure.name", "zero-memory"), base=False),
        "--out-dir": probe("--out-dir {tmp}/o", at(FIG + "make", "out", lambda p: p.name == "o")),
        "--work-dir": probe("--work-dir {tmp}/w", at(FIG + "make", "work", lambda p: p.parent.name == "w")),
        # any file that exists serves: the figure's job is not run here
        "--script": probe(
            ["timeline-bucketed", "--script", "{tmp}/hosts"],
            at(FIG + "make", "script", lambda s: s.endswith("hosts")),
            base=False,
        ),
        "--redraw": probe("--redraw", at(FIG + "draw", "figure.name", "ring-allreduce"), never(FIG + "make")),
    },
)
RING = "mpi_sgd.figures.ring."
PROBES["python -m mpi_sgd.figures.ring"] = Entry(
    ["--out", "r.json"],
    {RING + "record": lambda a, _: {"ranks": 1}, WRITE: "stop"},
    {"--out": probe("--out {tmp}/s.json", at(WRITE, "path", lambda p: str(p).endswith("s.json")))},
)
