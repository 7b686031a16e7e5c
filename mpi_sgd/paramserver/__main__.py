"""Asynchronous SGD with a parameter server on a built-in problem, and fault drills.

    mpiexec -n 4 python -m mpi_sgd.paramserver --evaluations 2000
    mpiexec -n 4 python -m mpi_sgd.paramserver --servers 2 --max-staleness 3 --lr-by-staleness
    mpiexec -disable-auto-cleanup -n 4 python -m mpi_sgd.paramserver --exit-rank 3 --exit-after 20
    mpiexec -disable-auto-cleanup -n 3 python -m mpi_sgd.paramserver --exit-rank 0 --exit-after 20

The last two are fault drills: the named rank's process exits at its N-th message sent, as a
crash would. A lost worker is reported and training finishes without it (the job's exit status
is then the lost rank's); a lost server ends the job within about --server-timeout seconds.
Rank 0 prints the staleness histogram, the final loss and every rank lost.
"""

from __future__ import annotations

import sys
import time

import torch

from .. import comm as mpicomm
from .. import data
from ..args import ArgumentParser, positive_int
from ..launch import pin_threads, placement
from ..models import MODELS, build_model
from . import AsyncConfig, histogram_text, mean_loss, train
from .faults import ExitAfter
from .staleness import mean


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m mpi_sgd.paramserver", description=__doc__)
    parser.add_argument("--model", choices=MODELS, default="ffnet", help="model to train (default ffnet)")
    parser.add_argument("--dataset", default="digits", help="built-in dataset or .npz/.pt file (default digits)")
    parser.add_argument("--exit-rank", type=int, help="fault drill: this rank's process exits ...")
    parser.add_argument("--exit-after", type=positive_int, default=10, help="... at its N-th message sent (10)")
    AsyncConfig.add_arguments(parser)
    args = parser.parse_args(argv)
    world = placement()
    try:  # every check before any communication, the same on every rank
        cfg = AsyncConfig.from_args(args)
        cfg.check_world(world.size)
        dataset = data.load(args.dataset, cfg.seed)
        data.check_size(len(dataset), cfg.workers(world.size), cfg.batch_size)
        if args.exit_rank is not None and not 0 <= args.exit_rank < world.size:
            raise ValueError(f"--exit-rank {args.exit_rank} is not a rank of this {world.size}-rank job")
    except ValueError as e:
        parser.error(str(e))

    comm = mpicomm.init()
    pin_threads(comm.local_size)
    if comm.rank == args.exit_rank:
        comm = ExitAfter(comm, args.exit_after)
    torch.manual_seed(cfg.seed)
    model = build_model(args.model, tuple(dataset.x.shape[1:]), dataset.num_outputs)
    start = mean_loss(model, dataset) if comm.rank == 0 else None
    begun = time.perf_counter()
    result = train(comm, model, dataset, cfg)
    if comm.rank == 0:
        print(
            f"{result.applied} gradients applied in {result.seconds:.2f} s by {cfg.workers(comm.size)} worker(s) "
            f"and {cfg.servers} server(s); per worker {dict(sorted(result.pushes_by_worker.items()))}"
        )
        print(f"staleness tau, mean {mean(result.staleness):.2f}:\n{histogram_text(result.staleness)}")
        print(f"loss {start:.4f} -> {mean_loss(model, dataset):.4f}")
        print(f"lost: {', '.join(f'rank {r} ({why})' for r, why in sorted(result.lost.items())) or 'none'}")
        print(f"done in {time.perf_counter() - begun:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
