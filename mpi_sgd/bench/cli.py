"""``mpi-sgd bench ...``: the benchmark commands. Run them under mpiexec, e.g.

mpiexec -n 2 mpi-sgd bench allreduce --max-bytes 64MiB
"""

from __future__ import annotations

from dataclasses import dataclass

from ..args import UsageError, add_command, choices_list, flag, nbytes, nonneg_int, positive_int
from ..comm import TORCH_BACKENDS
from ..report import Output
from . import asyncsgd, grid, pipeline, sgd, shm, validate, workers, zero
from .allreduce import IMPLS


@dataclass(frozen=True)
class Flags(Output):
    min_bytes: int = flag(4, "smallest message", nbytes)
    max_bytes: int = flag(64 << 20, "largest message", nbytes)
    impls: list = flag(
        ["raw", "seam", "ring", "gloo"],
        f"comma-separated implementations to time: {','.join(IMPLS)}",
        choices_list(IMPLS, "implementation"),
    )
    iterations: int | None = flag(
        None, "timed iterations per size (default: OSU's 1000 up to 8 KiB, 100 above)", positive_int
    )
    warmup: int | None = flag(None, "discarded iterations per size (default: OSU's 100/10)", nonneg_int)
    rounds: int = flag(
        8,
        "interleaved blocks per implementation, the order rotating each round; each rank reports its median block",
        positive_int,
    )
    detail: bool = flag(False, "also print min/avg/max and algbw/busbw per implementation")

    def __post_init__(self):
        if self.min_bytes > self.max_bytes:
            raise ValueError(f"--min-bytes ({self.min_bytes}) is larger than --max-bytes ({self.max_bytes})")


def _run_allreduce(args: Flags) -> int:
    from ..comm import init
    from ..comm.backends.torch_dist import backend_available
    from ..comm.wrappers.watchdog import without_watchdog
    from . import allreduce

    missing = [i for i in args.impls if i in TORCH_BACKENDS and not backend_available(i)]
    if missing:  # decided identically on every rank, before any communication
        raise UsageError(f"torch.distributed backend(s) not available in this torch: {', '.join(missing)}")
    # The seam's own cost per call is the question here, not the stall watchdog's (bench sgd times that)
    return allreduce.main(without_watchdog(init("mpi4py")), args)


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="run a benchmark (under mpiexec)")
    kinds = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    add_command(
        kinds,
        "allreduce",
        Flags,
        _run_allreduce,
        help="all-reduce sweep: seam vs raw mpi4py vs ring vs torch.distributed",
        description="Time all-reduce at power-of-two sizes, OSU style, implementations interleaved: the seam "
        "on torch tensors (seam), raw mpi4py Allreduce on numpy (raw), the ring built from send/recv (ring), "
        "torch.distributed gloo/nccl. Prints seam/raw and the seam's per-call overhead; writes JSON and PNG.",
    )
    grid.add_parser(kinds)
    workers.add_parser(kinds)
    sgd.add_parser(kinds)
    pipeline.add_parser(kinds)
    validate.add_parser(kinds)
    asyncsgd.add_parser(kinds)
    zero.add_parser(kinds)
    shm.add_parser(kinds)
