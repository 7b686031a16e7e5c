"""``mpi-sgd bench ...``: the benchmark commands. Run them under mpiexec, e.g.

mpiexec -n 2 mpi-sgd bench allreduce --max-bytes 64MiB
"""

from __future__ import annotations

from ..args import choices_list, nbytes, positive_int
from ..comm import TORCH_BACKENDS
from ..report import add_output_arguments
from . import asyncsgd, grid, pipeline, sgd, shm, validate, workers, zero
from .allreduce import IMPLS


def _run_allreduce(args) -> int:
    from ..comm import init
    from ..comm.backends.torch_dist import backend_available
    from ..comm.wrappers.watchdog import without_watchdog
    from . import allreduce

    missing = [i for i in args.impls if i in TORCH_BACKENDS and not backend_available(i)]
    if missing:  # decided identically on every rank, before any communication
        args.parser.error(f"torch.distributed backend(s) not available in this torch: {', '.join(missing)}")
    if args.min_bytes > args.max_bytes:
        args.parser.error(f"--min-bytes ({args.min_bytes}) is larger than --max-bytes ({args.max_bytes})")
    # The seam's own cost per call is the question here, not the stall watchdog's (bench sgd times that)
    return allreduce.main(without_watchdog(init("mpi4py")), args)


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="run a benchmark (under mpiexec)")
    kinds = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")

    p = kinds.add_parser(
        "allreduce",
        help="all-reduce sweep: seam vs raw mpi4py vs ring vs torch.distributed",
        description="Time all-reduce at power-of-two sizes, OSU style, implementations interleaved: the seam "
        "on torch tensors (seam), raw mpi4py Allreduce on numpy (raw), the ring built from send/recv (ring), "
        "torch.distributed gloo/nccl. Prints seam/raw and the seam's per-call overhead; writes JSON and PNG.",
    )
    p.add_argument("--min-bytes", type=nbytes, default=4, help="smallest message (default 4 B)")
    p.add_argument("--max-bytes", type=nbytes, default=64 << 20, help="largest message (default 64 MiB)")
    p.add_argument(
        "--impls",
        type=choices_list(IMPLS, "implementation"),
        default=["raw", "seam", "ring", "gloo"],
        help=f"comma-separated implementations to time: {','.join(IMPLS)} (default raw,seam,ring,gloo)",
    )
    p.add_argument(
        "--iterations",
        type=positive_int,
        default=None,
        help="timed iterations per size (default: OSU's 1000 up to 8 KiB, 100 above)",
    )
    p.add_argument("--warmup", type=int, default=None, help="discarded iterations per size (default: OSU's 100/10)")
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=8,
        help="interleaved blocks per implementation, the order rotating each round; each rank reports its "
        "median block (default 8)",
    )
    p.add_argument("--detail", action="store_true", help="also print min/avg/max and algbw/busbw per implementation")
    add_output_arguments(p)
    p.set_defaults(func=_run_allreduce, parser=p)
    grid.add_parser(kinds)
    workers.add_parser(kinds)
    sgd.add_parser(kinds)
    pipeline.add_parser(kinds)
    validate.add_parser(kinds)
    asyncsgd.add_parser(kinds)
    zero.add_parser(kinds)
    shm.add_parser(kinds)
