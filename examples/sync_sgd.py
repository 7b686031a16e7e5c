# mpiexec -n 2 python examples/sync_sgd.py
"""Synchronous SGD: R ranks, B samples each, one averaged gradient, the step of batch R*B.

Every rank holds a full replica of the model. Each step, each rank computes the gradient on its
own B samples, the ranks average those gradients (naive, flat or bucketed all-reduce; see
mpi_sgd/gradsync.py), and every rank applies the same update, so the replicas never drift apart.
The same file runs as one process (`python examples/sync_sgd.py`) and on many hosts
(`mpiexec -n 4 -hosts a,b python examples/sync_sgd.py`).

Try: --strategy naive|flat|bucketed, --optimizer adam, --dataset toy --model ffnet,
--grad-accum 4, --checkpoint ckpt.pt then --resume ckpt.pt, --metrics-json metrics.json.
"""

import torch

from mpi_sgd import comm as mpicomm
from mpi_sgd import data
from mpi_sgd.args import ArgumentParser
from mpi_sgd.config import TrainConfig
from mpi_sgd.launch import pin_threads, placement
from mpi_sgd.report import write_json
from mpi_sgd.trainer import Trainer

parser = ArgumentParser(description=__doc__)
TrainConfig.add_arguments(parser)
args = parser.parse_args()

# Everything that can be wrong with the input is found here, before MPI starts, identically on
# every rank: each exits with status 2 and no rank waits for another in a collective.
world = placement()
try:
    cfg = TrainConfig.from_args(args)
    dataset = data.load(cfg.dataset, cfg.seed)
    data.check_size(len(dataset), world.size, cfg.batch_size)
    dtype, device = getattr(torch, cfg.dtype), torch.device(cfg.device)
except (ValueError, RuntimeError) as e:
    parser.error(str(e))

comm = mpicomm.init(cfg.backend)
pin_threads(comm.local_size)  # ranks on one host share its cores instead of oversubscribing them
dataset = dataset.to(dtype, device)
if comm.is_root:
    task = "classification" if dataset.classification else "regression"
    print(
        f"{cfg.model} on {dataset.name} ({len(dataset)} samples, {task}); {comm.size} rank(s) x "
        f"batch {cfg.batch_size} = effective batch {comm.size * cfg.batch_size}; "
        f"{cfg.strategy} gradient averaging over {comm.backend}"
    )

# What 05_sgd_by_hand.py writes out, from the library: one replica of cfg.model per rank, rank 0's
# parameters broadcast to all (gradsync.broadcast_parameters), gradients averaged every step by
# cfg.strategy (gradsync.make), and Trainer's loop of steps around them (Trainer.from_config).
trainer = Trainer.from_config(cfg, dataset, comm)
if cfg.resume:
    trainer.load_checkpoint(cfg.resume)

metrics = trainer.train()
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
