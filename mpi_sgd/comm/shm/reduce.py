"""What one rank computes in the shared all-reduce (:mod:`.allreduce`): its slice, chunk by chunk.

The node's buffers are cut into R slices of whole cache lines (:func:`slice_bounds`); node rank r
owns slice r. :func:`reduce_slice` adds every rank's copy of the slice into the target's (its
own, or the node leader's across nodes) and, in the flat case, writes the sum into every other
rank's buffer, one chunk at a time so that the chunk is still in this core's cache when it is
copied out. :data:`CHUNK_BYTES` is chosen so that a chunk and the one added to it fit the per-core
L2 cache. Summation order is the target's own values first, then the others in rank order, and
every element is summed once, by its owner, so all ranks get the same bits.
"""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import torch
from mpi4py import MPI

CHUNK_BYTES = 128 << 10
LINE = 64  # bytes: slices start on cache-line boundaries
UFUNC = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}
MPI_OP = {"sum": MPI.SUM, "avg": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}
OP_NAMES = list(UFUNC)
OP_CODE = {op: i for i, op in enumerate(OP_NAMES)}

# A sum that overflows (or adds inf to -inf) gives inf or NaN, as MPI's own all-reduce would, and the
# non-finite check after every gradient all-reduce reports it; numpy's warning from inside this
# stand-in for MPI would only be noise. Filtered for this module alone, once: no cost per call.
warnings.filterwarnings("ignore", r"(overflow|invalid value) encountered", RuntimeWarning, re.escape(__name__))


@functools.lru_cache(maxsize=4096)
def slice_bounds(n: int, parts: int, part: int, itemsize: int) -> tuple[int, int]:
    """[lo, hi) of slice ``part`` of ``n`` elements cut into ``parts`` runs of whole cache lines.

    Lengths differ by at most one line; with fewer lines than parts the last slices are empty.
    (Cached: a call costs about as much as summing a few kilobytes.)
    """
    per_line = max(1, LINE // itemsize)
    lines = -(-n // per_line)
    base, extra = divmod(lines, parts)
    first = part * base + min(part, extra)
    last = first + base + (part < extra)
    return min(n, first * per_line), min(n, last * per_line)


def reduce_slice(
    acc_view: np.ndarray,
    sources: list[np.ndarray],
    a: int,
    b: int,
    op: str,
    push: bool,
    divide_by: int,
    half: torch.dtype | None = None,
) -> None:
    """Reduce elements [a, b) of every buffer in ``sources`` into ``acc_view`` (the target's own).

    ``divide_by`` > 1 divides the result ("avg"); with ``push`` the result is then written into
    every source buffer too, chunk by chunk. ``half`` (float16 or bfloat16, whose windows hold
    float16 or uint16 to numpy) sums in float32 and rounds once. MPI's user-defined ops for 16-bit
    floats (:mod:`mpi_sgd.comm.backends.mpitypes`) round after each of MPI's R-1 additions, as they
    must, so from three ranks on the two paths can differ in the last bits; once is the closer sum.
    """
    if half is not None:
        return _reduce_half(acc_view, sources, a, b, op, push, divide_by, half)
    ufunc = UFUNC[op]
    step = CHUNK_BYTES // acc_view.itemsize
    for c in range(a, b, step):
        d = min(c + step, b)
        acc = acc_view[c:d]
        for src in sources:
            ufunc(acc, src[c:d], out=acc)
        if divide_by > 1:
            np.divide(acc, divide_by, out=acc)
        if push:
            for dst in sources:
                np.copyto(dst[c:d], acc)


_TORCH_OP = {"sum": torch.add, "avg": torch.add, "min": torch.minimum, "max": torch.maximum, "prod": torch.mul}


def _reduce_half(acc_view, sources, a: int, b: int, op: str, push: bool, divide_by: int, half) -> None:
    def chunk(view, c, d):
        return torch.from_numpy(view[c:d]).view(half)

    combine = _TORCH_OP[op]
    step = CHUNK_BYTES // 4  # elements: the float32 sum is the largest operand
    for c in range(a, b, step):
        d = min(c + step, b)
        target = chunk(acc_view, c, d)
        acc = target.float()
        for src in sources:
            combine(acc, chunk(src, c, d).float(), out=acc)
        if divide_by > 1:
            acc.div_(divide_by)
        target.copy_(acc)  # rounded to nearest, once
        if push:
            for dst in sources:
                chunk(dst, c, d).copy_(target)
