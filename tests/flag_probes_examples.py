"""The probes of the examples' flags: for each flag, a value and where that value must show."""

from __future__ import annotations

import re

import torch

from mpi_sgd.perfmodel import PRESETS
from tests.flag_checks import (
    FAKE,
    LOAD,
    MLP,
    PREPARE,
    SERVER,
    SERVERS_OWN,
    TRAIN,
    WRITE,
    Entry,
    FakeTrainer,
    at,
    configs,
    first_batch,
    numel,
    prints,
    probe,
    two_steps,
)

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
                nonfinite_verdict=("next-step", "next-step"),
                check_every=("7", 7),
                progress=(None, True),
                lr_scaling=("linear", "linear"),
                base_batch=("16", 16),
                warmup=("2ep", "2ep"),
                schedule=("cosine", "cosine"),
                target_val_loss=("0.3", 0.3),
                target_val_accuracy=("0.9", 0.9),
            ),
            # one process measures the noise scale between micro-batches: it needs two or more
            "--noise-scale": probe("--noise-scale --grad-accum 2", at(TRAIN, "cfg.noise_scale", True)),
            "--adascale": probe("--adascale --grad-accum 2", at(TRAIN, "cfg.adascale", True)),
            "--eval-every": probe("--eval-every 5 --target-val-loss 0.1", at(TRAIN, "cfg.eval_every", 5)),
            "--checkpoint-every": probe(
                "--checkpoint {tmp}/ck --checkpoint-every 5", at(TRAIN, "cfg.checkpoint_every", 5)
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
            "--save-timeout": probe("--save-timeout 30", at(TRAIN, "cfg.save_timeout", 30.0)),
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
            DIST + "barrier": lambda a, _: None,
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
        "--b-noise": probe("--b-noise 50", prints(r"^to a target accuracy: B_noise = 50 \(--b-noise\)")),
        "--metrics-json": probe("--metrics-json {tmp}/m.json", prints(r"B_noise = 40 \(the epochs' mean estimates")),
        "--s-min": probe("--b-noise 50 --s-min 10", prints(r"^time to the target: R = 1: ")),
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
        "--b-noise": probe("--t-comp 0.01 --b-noise 50", at(PROBLEM, "b_noise", 50.0)),
        "--batch-size": probe("--t-comp 0.01 --b-noise 50 --batch-size 64", at(PROBLEM, "batch", 64)),
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
