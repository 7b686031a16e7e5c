"""``mpi-sgd bench ...``: the benchmark commands. Run them under mpiexec, e.g.

mpiexec -n 2 mpi-sgd bench allreduce --max-bytes 64MiB
"""

from __future__ import annotations

import argparse

from .report import parse_bytes


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _impls(text: str) -> list[str]:
    from .allreduce import IMPLS

    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in IMPLS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown implementation(s) {bad or text!r}; choose from {','.join(IMPLS)}")
    return names


def _run_allreduce(args) -> int:
    from ..comm import init
    from ..comm.torch_dist import backend_available
    from . import allreduce

    missing = [i for i in args.impls if i in ("gloo", "nccl", "mpi") and not backend_available(i)]
    if missing:  # decided identically on every rank, before any communication
        args.parser.error(f"torch.distributed backend(s) not available in this torch: {', '.join(missing)}")
    if args.min_bytes > args.max_bytes:
        args.parser.error(f"--min-bytes ({args.min_bytes}) is larger than --max-bytes ({args.max_bytes})")
    return allreduce.main(init("mpi4py"), args)


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="run a benchmark (under mpiexec)")
    kinds = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")

    p = kinds.add_parser(
        "allreduce",
        help="all-reduce sweep: seam vs raw mpi4py vs ring vs torch.distributed",
        description=__import__(__name__.rsplit(".", 1)[0] + ".allreduce", fromlist=["_"]).__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--min-bytes", type=_size, default=4, help="smallest message (default 4 B)")
    p.add_argument("--max-bytes", type=_size, default=64 << 20, help="largest message (default 64 MiB)")
    p.add_argument(
        "--impls",
        type=_impls,
        default=["raw", "seam", "ring", "gloo"],
        help="comma-separated implementations to time: raw,seam,ring,gloo,nccl (default raw,seam,ring,gloo)",
    )
    p.add_argument(
        "--iterations",
        type=_positive_int,
        default=None,
        help="timed iterations per size (default: OSU's 1000 up to 8 KiB, 100 above)",
    )
    p.add_argument("--warmup", type=int, default=None, help="discarded iterations per size (default: OSU's 100/10)")
    p.add_argument(
        "--rounds",
        type=_positive_int,
        default=5,
        help="interleaved blocks per implementation; each rank reports its median block (default 5)",
    )
    p.add_argument("--detail", action="store_true", help="also print min/avg/max and algbw/busbw per implementation")
    p.add_argument("--out-dir", default="results", help="folder for the JSON and PNG (default results)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.set_defaults(func=_run_allreduce, parser=p)

    from . import sgd

    sgd.add_parser(kinds)
