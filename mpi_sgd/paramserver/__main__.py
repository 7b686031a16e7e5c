"""Asynchronous SGD with a parameter server on a built-in problem, and fault drills.

    python -m mpi_sgd.paramserver --evaluations 500
    mpiexec -n 4 python -m mpi_sgd.paramserver --evaluations 2000
    mpiexec -n 4 python -m mpi_sgd.paramserver --servers 2 --max-staleness 3 --lr-by-staleness
    mpiexec -disable-auto-cleanup -n 4 python -m mpi_sgd.paramserver --exit-rank 3 --exit-after 20
    mpiexec -disable-auto-cleanup -n 3 python -m mpi_sgd.paramserver --exit-rank 0 --exit-after 20

As one process, the one rank is server and worker: every gradient is applied on the version it
was computed on (staleness 0), which is plain SGD with momentum. The last two are fault drills:
the named rank's process exits at its N-th message sent, as a crash would. A lost worker is
reported and training finishes without it (the job's exit status is then the lost rank's); a lost
server ends the job within about --server-timeout seconds. Rank 0 prints the staleness histogram,
the final loss and every rank lost.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch

from .. import comm as mpicomm
from .. import data
from ..args import ArgumentParser, flag, integer, positive_int
from ..launch import pin_threads, placement
from ..models import MODELS, build_model
from . import AsyncConfig, histogram_text, mean_loss, train
from .faults import ExitAfter
from .staleness import mean


@dataclass(frozen=True)
class Run:
    model: str = flag("ffnet", "model to train", choices=MODELS)
    dataset: str = flag("digits", "built-in dataset or .npz/.pt file")
    exit_rank: int | None = flag(None, "fault drill: this rank's process exits ...", integer)
    exit_after: int = flag(10, "... at its N-th message sent", positive_int)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m mpi_sgd.paramserver", description=__doc__)
    parser.add_flags(Run)
    # The snapshots are for loss curves (mpi-sgd bench async draws them); nothing here shows them.
    parser.add_flags(AsyncConfig, skip=("snapshot_every",))
    args = parser.parse_args(argv)
    run, cfg = parser.build(Run, args), parser.build(AsyncConfig, args)
    world = placement()
    try:  # every check before any communication, the same on every rank
        cfg.check_world(world.size)
        dataset = data.load(run.dataset, cfg.seed)
        data.check_size(len(dataset), cfg.workers(world.size), cfg.batch_size)
        if run.exit_rank is not None and not 0 <= run.exit_rank < world.size:
            raise ValueError(f"--exit-rank {run.exit_rank} is not a rank of this {world.size}-rank job")
        if run.exit_rank is not None and world.size == 1:
            raise ValueError("--exit-rank drills a lost rank; one process sends no messages: run 2 or more ranks")
    except ValueError as e:
        parser.fail(str(e))

    comm = mpicomm.init()
    pin_threads(comm.local_size)
    if comm.rank == run.exit_rank:
        comm = ExitAfter(comm, run.exit_after)
    torch.manual_seed(cfg.seed)
    model = build_model(run.model, tuple(dataset.x.shape[1:]), dataset.num_outputs)
    start = mean_loss(model, dataset) if comm.rank == 0 else None
    begun = time.perf_counter()
    result = train(comm, model, dataset, cfg)
    if comm.rank == 0:
        roles = (
            "rank 0 as server and worker (one process: staleness 0, plain SGD)"
            if comm.size == 1
            else f"{cfg.workers(comm.size)} worker(s) and {cfg.servers} server(s)"
        )
        print(
            f"{result.applied} gradients applied in {result.seconds:.2f} s by {roles}; "
            f"per worker {dict(sorted(result.pushes_by_worker.items()))}"
        )
        print(f"staleness tau, mean {mean(result.staleness):.2f}:\n{histogram_text(result.staleness)}")
        print(f"loss {start:.4f} -> {mean_loss(model, dataset):.4f}")
        print(f"lost: {', '.join(f'rank {r} ({why})' for r, why in sorted(result.lost.items())) or 'none'}")
        print(f"done in {time.perf_counter() - begun:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
