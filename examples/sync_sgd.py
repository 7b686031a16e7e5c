# mpiexec -n 2 python examples/sync_sgd.py
"""Step 6: synchronous SGD from the library, the trainer users run: step 5's loop, every option.

R ranks, B samples each, one averaged gradient, the step of batch R*B. Every rank holds a full
replica of the model. Each step, each rank computes the gradient on its own B samples, the ranks
average those gradients (naive, flat or bucketed all-reduce; see mpi_sgd/gradsync.py), and every
rank applies the same update, so the replicas never drift apart.
The same file runs as one process (`python examples/sync_sgd.py`) and on many hosts
(`mpiexec -n 4 -hosts a,b python examples/sync_sgd.py`).

Try: --strategy naive|flat|bucketed, --optimizer adam, --dataset toy --model ffnet,
--dataset your.npz, --val-fraction 0.2, --grad-accum 4, --checkpoint ckpts then
--resume auto, --on-nonfinite skip, --metrics-json metrics.json, --zero 1|2|3 (sharded data
parallel; see examples/07_zero.py), --amp bf16, --compress bf16, --backend torch-mpi4py; on GPUs
--device cuda (one per rank).
"""

import sys

import torch

from mpi_sgd import comm as mpicomm
from mpi_sgd import data
from mpi_sgd.agree import ConfigMismatch, ReplicasDiverged
from mpi_sgd.args import ArgumentParser
from mpi_sgd.checkpoint import CheckpointError
from mpi_sgd.comm.gpu import local_device
from mpi_sgd.config import TrainConfig
from mpi_sgd.launch import pin_threads, placement
from mpi_sgd.models import build_model, check_input
from mpi_sgd.preemption import EXIT_STATUS as PREEMPTED
from mpi_sgd.preemption import Preempted
from mpi_sgd.report import write_json
from mpi_sgd.trainer import Trainer, TrainingDiverged

parser = ArgumentParser(description=__doc__)
cfg = parser.parse_flags(TrainConfig)  # every field of TrainConfig is a flag

# Everything that can be wrong with the input is found here, before MPI starts, identically on
# every rank: each exits with status 2 and no rank waits for another in a collective.
world = placement()
try:
    cfg.check_given(parser.given())
    cfg.check_machine(world.size)
    train, val = data.prepare(cfg.dataset, cfg.seed, cfg.val_fraction)  # val: held out, same on every rank
    steps_per_epoch = data.check_size(len(train), world.size, cfg.batch_size)
    if not cfg.resume:  # (a resumed run's steps go on from the checkpoint's, at its world size)
        mpicomm.check_fault_step(min(cfg.epochs * steps_per_epoch, cfg.max_steps or float("inf")))
    dtype, device = getattr(torch, cfg.dtype), local_device(cfg.device, world.local_rank, world.local_size)
    # a CPU replica only to try the data's shape on; Trainer.from_config builds the real one
    check_input(build_model(cfg.model, tuple(train.x.shape[1:]), train.num_outputs), train.x[:2], cfg.model)
except (ValueError, RuntimeError) as e:
    parser.fail(str(e))

comm = mpicomm.init(cfg.backend, stall_timeout=cfg.stall_timeout, stall_abort=cfg.stall_abort)
pin_threads(comm.local_size)  # ranks on one host share its cores instead of oversubscribing them
train = train.to(dtype, device)
val = val.to(dtype, device) if val is not None else None
if comm.is_root:
    task = "classification" if train.classification else "regression, targets standardised"
    print(
        f"{cfg.model} on {train.name} ({len(train)} samples, {len(val) if val else 0} held out; {task});\n"
        f"{comm.size} rank(s) x batch {cfg.batch_size} = effective batch {comm.size * cfg.batch_size}; "
        f"{f'ZeRO stage {cfg.zero}' if cfg.zero else cfg.strategy} gradient averaging over {comm.backend}"
    )

# What 05_sgd_by_hand.py writes out, from the library: one replica of cfg.model per rank, rank 0's
# parameters broadcast to all (gradsync.broadcast_parameters), gradients averaged every step by
# cfg.strategy (gradsync.make) or sharded by ZeRO stage cfg.zero (zero.make), and Trainer's loop
# of steps around them (Trainer.from_config). Ranks started with other flags or data are refused
# there, on every rank alike, before training.
try:
    trainer = Trainer.from_config(cfg, train, comm, val=val)
    if cfg.resume:  # the root reads it and broadcasts its bytes; every rank gets the same verdict
        auto = {"auto": True, "auto-or-fresh": "or-fresh"}.get(cfg.resume, False)
        used = trainer.load_checkpoint(cfg.checkpoint if auto else cfg.resume, auto, parser.given())
        if comm.is_root:
            print(f"resuming from {used} at step {trainer.step}" if used else "no checkpoint yet: starting afresh")
except (ConfigMismatch, CheckpointError) as e:
    parser.fail(str(e))

try:
    metrics = trainer.train()
except CheckpointError as e:  # a save that failed (a full disk): one line, on every rank alike
    if comm.is_root:
        print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)
except (TrainingDiverged, ReplicasDiverged) as e:  # every rank stops at the same step, same verdict
    if comm.is_root:
        print(e, file=sys.stderr, flush=True)
    sys.exit(1)
except Preempted as e:  # SIGTERM or SIGUSR1 (Slurm's time limit, preemption): that step saved
    if comm.is_root:
        print(e, flush=True)
    sys.exit(PREEMPTED)
timeline = trainer.timeline() if cfg.timeline else None

if comm.is_root:
    s = metrics["summary"]
    print(
        f"{metrics['steps']} steps; per step T_comp {1e3 * s['t_comp']:.2f} ms, "
        f"T_sync {1e3 * s['t_sync']:.2f} ms (slowest rank, mean after warm-up)"
    )
    if cfg.metrics_json:
        write_json(cfg.metrics_json, metrics)
    if cfg.timeline:
        write_json(cfg.timeline, timeline)
