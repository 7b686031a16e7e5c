"""Collectives built from point-to-point messages, to see what MPI does inside.

The ring all-reduce (Patarasuk & Yuan 2009) is a reduce-scatter followed by an allgather,
both around a ring where rank ``r`` sends to ``r+1`` and receives from ``r-1``. The buffer is
cut into ``p`` segments. In step ``s`` of the reduce-scatter, rank ``r`` sends segment
``r-s`` and adds what arrives into segment ``r-s-1``; after ``p-1`` steps it owns the full
reduction of segment ``r+1``. The allgather then passes the finished segments around the ring
for ``p-1`` more steps. Each rank sends ``2(p-1)/p * n`` elements in all, the bandwidth lower
bound for all-reduce, which is why the ring is what NCCL and MPI use for large messages.

Works for any length (segments differ by at most one element; some are empty when ``n < p``)
and any world size, on any :class:`~mpi_sgd.comm.Communicator`.
"""

from __future__ import annotations

import numpy as np

from .comm.base import Communicator, check_op, displacements, split_counts
from .comm.buffers import as_array

_COMBINE = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}


def ring_reduce_scatter(comm: Communicator, data: np.ndarray, op: str = "sum", scratch=None) -> int:
    """Reduce ``data`` (flat, in place) so that rank ``r`` ends up with segment ``(r+1) % p`` complete.

    Returns the index of the segment this rank owns. ``scratch`` receives incoming segments; it
    needs room for the largest one and is allocated if not given.
    """
    p, r = comm.size, comm.rank
    counts = split_counts(data.size, p)
    starts = displacements(counts)
    right, left = (r + 1) % p, (r - 1) % p
    if scratch is None:
        scratch = np.empty(max(counts), dtype=data.dtype)
    combine = _COMBINE[op]
    for step in range(p - 1):
        send_seg, recv_seg = (r - step) % p, (r - step - 1) % p
        lo, n = starts[recv_seg], counts[recv_seg]
        incoming = scratch[:n]
        # Post the receive first, then send: neither side can block the other.
        req = comm.irecv(incoming, left, tag=step)
        comm.send(data[starts[send_seg] : starts[send_seg] + counts[send_seg]], right, tag=step)
        req.wait()
        combine(data[lo : lo + n], incoming, out=data[lo : lo + n])
    return (r + 1) % p


def ring_allgather(comm: Communicator, data: np.ndarray, owned: int) -> None:
    """Pass complete segments around the ring until every rank has all of them (in place)."""
    p, r = comm.size, comm.rank
    counts = split_counts(data.size, p)
    starts = displacements(counts)
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        send_seg, recv_seg = (owned - step) % p, (owned - step - 1) % p
        req = comm.irecv(data[starts[recv_seg] : starts[recv_seg] + counts[recv_seg]], left, tag=p + step)
        comm.send(data[starts[send_seg] : starts[send_seg] + counts[send_seg]], right, tag=p + step)
        req.wait()


def ring_allreduce(comm: Communicator, buf, op: str = "sum", scratch=None):
    """All-reduce ``buf`` in place with the ring algorithm; same result as ``comm.allreduce``.

    ``buf`` is a contiguous torch tensor or numpy array of any shape. Sums may differ from
    MPI's in the last bits for floating point, since the additions happen in another order.
    """
    check_op(op)
    data = as_array(buf).reshape(-1)
    if op == "avg" and data.dtype.kind not in "fc":
        raise TypeError(f"op 'avg' needs a floating dtype, got {data.dtype}")
    if comm.size > 1:
        owned = ring_reduce_scatter(comm, data, op, scratch)
        ring_allgather(comm, data, owned)
    if op == "avg":
        data /= comm.size
    return buf
