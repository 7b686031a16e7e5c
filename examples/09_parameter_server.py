# mpiexec -n 3 python examples/09_parameter_server.py
"""Step 9: asynchronous SGD with a parameter server, beside step 6's synchronous SGD on the same problem.

Rank 0 serves the parameters; the other R - 1 ranks are workers. A worker pulls the parameters,
computes a gradient on its own batch and pushes it; the server applies each push the moment it
arrives and answers with the new parameters. No worker ever waits for another (see
mpi_sgd/paramserver). The price is staleness: a gradient computed on version v of the parameters
is applied at version V >= v, tau = V - v versions late.

The same ranks first train synchronously (every rank a replica, gradients averaged each step, as
in examples/sync_sgd.py), then asynchronously from the same initial model for the same number of
gradient evaluations. Synchronous SGD takes one step of --lr per R gradients, so each
asynchronous gradient gets lr / R: both move the parameters as far per sample. Prints the
staleness histogram and both final losses. As one process, rank 0 is server and worker: every
gradient is applied on the version it was computed on, and both runs are plain SGD.

Try: --servers 2 (at 4 ranks), --max-staleness 2, --lr-by-staleness, --straggler-ms 20.
"""

import time
from dataclasses import replace

import torch

from mpi_sgd import comm as mpicomm
from mpi_sgd import data, gradsync, paramserver
from mpi_sgd.args import ArgumentParser
from mpi_sgd.config import TrainConfig
from mpi_sgd.launch import pin_threads, placement
from mpi_sgd.models import build_model
from mpi_sgd.paramserver import AsyncConfig
from mpi_sgd.replicas import replicate
from mpi_sgd.trainer import Trainer, make_optimizer

# Of the trainer's flags, those these two runs use (--strategy and --bucket-mb: the synchronous
# run's all-reduce); of the server's, all but those the first set (lr, momentum, batch, seed) and
# the gradient count, which is the synchronous run's.
TRAINING = ("model", "dataset", "epochs", "batch_size", "lr", "momentum", "seed", "dtype", "strategy", "bucket_mb")
parser = ArgumentParser(description=__doc__)
parser.add_flags(TrainConfig, only=(*TRAINING, "stall_timeout", "stall_abort", "progress"))
parser.add_flags(AsyncConfig, skip=("lr", "momentum", "batch_size", "seed", "evaluations", "snapshot_every"))
parser.set_defaults(epochs=4, progress=False)
args = parser.parse_args()

# Every check before MPI starts, identically on every rank: a bad value exits 2 everywhere.
world = placement()
cfg = parser.build(TrainConfig, args)
async_cfg = parser.build(
    AsyncConfig, args, lr=cfg.lr / world.size, momentum=cfg.momentum, batch_size=cfg.batch_size, seed=cfg.seed
)
try:
    async_cfg.check_world(world.size)
    dataset = data.load(cfg.dataset, cfg.seed)
    data.check_size(len(dataset), world.size, cfg.batch_size)
except ValueError as e:
    parser.fail(str(e))

comm = mpicomm.init(stall_timeout=cfg.stall_timeout, stall_abort=cfg.stall_abort)
pin_threads(comm.local_size)
dtype = getattr(torch, cfg.dtype)
dataset = dataset.to(dtype)


def fresh_model():
    """The same initial model for both runs; dropout then draws a different stream on each rank."""
    return replicate(
        lambda: build_model(cfg.model, tuple(dataset.x.shape[1:]), dataset.num_outputs).to(dtype=dtype), comm, cfg.seed
    )


# 1. Synchronous SGD on all R ranks: every step, R gradients averaged, one update.
model = fresh_model()
sync = gradsync.make(cfg.strategy, model, comm, cfg.bucket_mb)
trainer = Trainer(model, make_optimizer(cfg, model), sync, dataset, comm, cfg)
began = time.perf_counter()
trainer.train()
sync_seconds = time.perf_counter() - began
sync_loss = paramserver.mean_loss(model, dataset)
evaluations = trainer.step * comm.size

# 2. Asynchronous SGD: the same number of gradients, each applied on its own as it arrives.
model = fresh_model()
async_cfg = replace(async_cfg, evaluations=evaluations)
result = paramserver.train(comm, model, dataset, async_cfg)

if comm.is_root:
    ranks = f"{async_cfg.servers} server(s) + {async_cfg.workers(comm.size)} worker(s)"
    print(
        f"\nsynchronous:  {comm.size} ranks x {trainer.step} steps = {evaluations} gradients of "
        f"{cfg.batch_size} samples in {sync_seconds:.2f} s"
    )
    print(
        f"asynchronous: {ranks if comm.size > 1 else 'rank 0 as server and worker'}, {result.applied} "
        f"gradients in {result.seconds:.2f} s; per worker {dict(sorted(result.pushes_by_worker.items()))}"
    )
    print(f"staleness tau of the {result.applied} gradients (server version at apply - version computed on):")
    print(paramserver.histogram_text(result.staleness))
    print(f"final loss: asynchronous {paramserver.mean_loss(model, dataset):.4f} vs synchronous {sync_loss:.4f}")
    if result.lost:
        print(f"lost on the way: {', '.join(f'rank {r}' for r in sorted(result.lost))}")
