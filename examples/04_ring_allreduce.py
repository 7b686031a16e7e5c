# mpiexec -n 4 python examples/04_ring_allreduce.py
"""Step 4: all-reduce built from send/recv — the ring — checked against MPI's and timed beside it.

The buffer is cut into `size` segments. Reduce-scatter: for size-1 steps each rank passes one
segment to its right neighbour and adds the one arriving from the left, until every rank owns one
fully reduced segment. Allgather: size-1 more steps pass the finished segments around. Each rank
sends 2(size-1)/size of the buffer in all, whatever the world size: the bandwidth lower bound.
The algorithm lives in mpi_sgd.collectives.ring_allreduce; this file drives it.
"""

import numpy as np
import torch

from mpi_sgd.args import ArgumentParser
from mpi_sgd.collectives import ring_allreduce
from mpi_sgd.comm import init
from mpi_sgd.timing import time_interleaved

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}

parser = ArgumentParser(description=__doc__)
parser.add_argument(
    "--length",
    type=int,
    default=1_000_003,
    help="elements in the buffer; any length works, prime by default (default 1000003)",
)
parser.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default float32)")
parser.add_argument("--iterations", type=int, default=50, help="timed all-reduces per implementation (default 50)")
parser.add_argument("--seed", type=int, default=0, help="base seed; rank r draws its data with seed + r")
args = parser.parse_args()
if args.length < 1 or args.iterations < 1:
    parser.error("--length and --iterations must be at least 1")

comm = init("mpi4py")
dtype = DTYPES[args.dtype]

# Each rank holds different data (seed + rank): that is what makes the reduction worth checking.
g = torch.Generator().manual_seed(args.seed + comm.rank)
if dtype.is_floating_point:
    mine = torch.randn(args.length, generator=g, dtype=dtype)
else:
    mine = torch.randint(-1000, 1000, (args.length,), generator=g, dtype=dtype)

ring = ring_allreduce(comm, mine.clone())
mpi = comm.allreduce(mine.clone())

# Integers must agree exactly. Floats are added in a different order by the ring than by MPI,
# so they agree to rounding: each of the size-1 additions adds at most one ulp of the running sum.
if dtype.is_floating_point:
    tol = comm.size * torch.finfo(dtype).eps * mpi.abs().max().item()
    worst = (ring - mpi).abs().max().item()
    ok = worst <= tol
else:
    tol, worst = 0, (ring - mpi).abs().max().item()
    ok = torch.equal(ring, mpi)
ok = all(comm.allgather_obj(ok))

# Time both the way OSU does: barrier, warm-up discarded, blocks interleaved, median block.
scratch = np.empty(args.length // comm.size + 1, dtype=mine.numpy().dtype)
buf_ring, buf_mpi = mine.clone(), mine.clone()
stats = time_interleaved(
    comm,
    {"ring": lambda: ring_allreduce(comm, buf_ring, scratch=scratch), "MPI Allreduce": lambda: comm.allreduce(buf_mpi)},
    iterations=args.iterations,
    warmup=max(1, args.iterations // 10),
)

if comm.is_root:
    nbytes = mine.numel() * mine.element_size()
    print(f"{comm.size} ranks, {args.length} x {args.dtype} ({nbytes / 2**20:.2f} MiB)")
    print(f"ring vs MPI Allreduce: max |difference| {worst:.3g} (tolerance {tol:.3g}): {'agree' if ok else 'DISAGREE'}")
    for name, st in stats.items():
        print(
            f"{name:>14}: {st.avg * 1e3:8.3f} ms per all-reduce (min {st.min * 1e3:.3f}, max {st.max * 1e3:.3f} "
            f"over ranks)"
        )
if not ok:
    raise SystemExit(1)
