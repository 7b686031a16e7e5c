"""``mpi-sgd bench ...``: the benchmark commands. Run them under mpiexec, e.g.

mpiexec -n 2 mpi-sgd bench allreduce --max-bytes 64MiB

Each benchmark registers itself from its own module (``add_parser``); this file lists them.
"""

from __future__ import annotations

from . import allreduce, asyncsgd, ddp, goodput, grid, pipeline, sgd, shm, validate, workers, zero


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="run a benchmark (under mpiexec)")
    kinds = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for module in (allreduce, grid, workers, sgd, ddp, pipeline, validate, goodput, asyncsgd, zero, shm):
        module.add_parser(kinds)
