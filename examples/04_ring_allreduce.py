# mpiexec -n 4 python examples/04_ring_allreduce.py
"""Step 4: all-reduce built from send/recv — the ring — checked against MPI's and timed beside it.

The buffer is cut into `size` segments. Reduce-scatter: for size-1 steps each rank passes one
segment to its right neighbour and adds the one arriving from the left, until every rank owns one
fully reduced segment. All-gather: size-1 more steps pass the finished segments around. Each rank
sends 2(size-1)/size of the buffer in all, whatever the world size: the bandwidth lower bound
(Patarasuk & Yuan 2009), which is why MPI and NCCL use the ring for large messages. The
benchmarks time the library's copy of it, mpi_sgd.collectives.ring_allreduce.
"""

from dataclasses import dataclass

import torch

from mpi_sgd.args import ArgumentParser, flag, integer, positive_int
from mpi_sgd.comm import init
from mpi_sgd.timing import time_interleaved

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}


@dataclass(frozen=True)
class Flags:
    length: int = flag(1_000_003, "elements in the buffer; any length works, prime by default", positive_int)
    dtype: str = flag("float32", "element type", choices=DTYPES)
    iterations: int = flag(50, "timed all-reduces per implementation", positive_int)
    seed: int = flag(0, "base seed; rank r draws its data with seed + r", integer)


def ring_allreduce(comm, x):
    """Sum the flat tensor ``x`` over all ranks, in place, by the ring."""
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    segments = torch.tensor_split(x, p)  # p views of x; lengths differ by one at most, the first longest
    incoming = torch.empty_like(segments[0])
    # Reduce-scatter: in step s rank r sends segment r-s and adds what arrives into segment r-s-1.
    # Its left neighbour added into that segment one step earlier, so after p-1 steps rank r holds
    # segment r+1 summed over every rank.
    for step in range(p - 1):
        mine, theirs = segments[(r - step) % p], segments[(r - step - 1) % p]
        got = incoming[: len(theirs)]
        request = comm.irecv(got, left, tag=step)  # receive posted first: the ring cannot deadlock
        comm.send(mine, right, tag=step)
        request.wait()
        theirs += got
    # All-gather: in step s rank r passes on segment r+1-s, finished, and receives segment r-s.
    for step in range(p - 1):
        mine, theirs = segments[(r + 1 - step) % p], segments[(r - step) % p]
        request = comm.irecv(theirs, left, tag=p + step)
        comm.send(mine, right, tag=p + step)
        request.wait()
    return x


args = ArgumentParser(description=__doc__).parse_flags(Flags)
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

# Integers must agree exactly. Floats are added in another order by the ring than by MPI; any
# order of summing p terms errs by at most (p-1)·u·Σ|x_r| (Higham, Accuracy and Stability, §4.2),
# so the two sums differ by at most twice that.
worst = (ring - mpi).abs().max().item()
if dtype.is_floating_point:
    bound = 2 * (comm.size - 1) * torch.finfo(dtype).eps * comm.allreduce(mine.abs())
    ok, tol = bool(((ring - mpi).abs() <= bound).all()), bound.max().item()
else:
    ok, tol = torch.equal(ring, mpi), 0
ok = all(comm.allgather_obj(ok))

# Time both the way OSU does: barrier, warm-up discarded, blocks interleaved, median block.
buf_ring, buf_mpi = mine.clone(), mine.clone()
stats = time_interleaved(
    comm,
    {"ring": lambda: ring_allreduce(comm, buf_ring), "MPI Allreduce": lambda: comm.allreduce(buf_mpi)},
    iterations=args.iterations,
    warmup=max(1, args.iterations // 10),
)

if comm.is_root:
    nbytes = mine.numel() * mine.element_size()
    print(f"{comm.size} ranks, {args.length} x {args.dtype} ({nbytes / 2**20:.2f} MiB); element 0 sums to {mpi[0]:g}")
    print(f"ring vs MPI Allreduce: max |difference| {worst:.3g} (tolerance {tol:.3g}): {'agree' if ok else 'DISAGREE'}")
    for name, st in stats.items():
        print(
            f"{name:>14}: {st.avg * 1e3:8.3f} ms per all-reduce (min {st.min * 1e3:.3f}, max {st.max * 1e3:.3f} "
            f"over ranks)"
        )
if not ok:
    raise SystemExit(1)
