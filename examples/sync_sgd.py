# mpiexec -n 2 python examples/sync_sgd.py
"""Synchronous SGD: R ranks, B samples each, one averaged gradient, the step of batch R*B.

Every rank holds a full replica of the model. Each step, each rank computes the gradient on its
own B samples, the ranks average those gradients (naive, flat or bucketed all-reduce; see
mpi_sgd/gradsync.py), and every rank applies the same update, so the replicas never drift apart.
The same file runs as one process (`python examples/sync_sgd.py`) and on many hosts
(`mpiexec -n 4 -hosts a,b python examples/sync_sgd.py`).

Try: --strategy naive|flat|bucketed, --optimizer adam, --dataset toy --model ffnet,
--grad-accum 4, --checkpoint ckpt.pt then --resume ckpt.pt, --metrics-json metrics.json,
--zero 1|2|3 (sharded data parallel; see examples/07_zero.py).
"""

import torch

from mpi_sgd import comm as mpicomm
from mpi_sgd import data, gradsync, zero
from mpi_sgd.args import ArgumentParser
from mpi_sgd.config import TrainConfig
from mpi_sgd.launch import pin_threads, placement
from mpi_sgd.models import build_model
from mpi_sgd.trainer import Trainer, make_optimizer, write_json

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
        f"{f'ZeRO stage {cfg.zero}' if cfg.zero else cfg.strategy} gradient averaging over {comm.backend}"
    )

# The same seed on every rank gives the same initial model; the broadcast from rank 0 makes it
# certain. Afterwards each rank reseeds with seed + rank, since dropout masks must differ.
torch.manual_seed(cfg.seed)
model = build_model(cfg.model, tuple(dataset.x.shape[1:]), dataset.num_outputs).to(device, dtype)
gradsync.broadcast_parameters(model, comm)
torch.manual_seed(cfg.seed + comm.rank)

events = [] if cfg.timeline else None
if cfg.zero:  # sharded data parallel (mpi_sgd/zero): the optimizer steps on this rank's shards
    sync, optimizer = zero.make(cfg.zero, model, comm, lambda shards: make_optimizer(cfg, shards), events)
else:
    optimizer = make_optimizer(cfg, model)
    sync = gradsync.make(cfg.strategy, model, comm, cfg.bucket_mb, events)
trainer = Trainer(model, optimizer, sync, dataset, comm, cfg)
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
        write_json(metrics, cfg.metrics_json)
    if cfg.timeline:
        write_json(timeline, cfg.timeline)
