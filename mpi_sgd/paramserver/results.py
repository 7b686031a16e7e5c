"""After training: every other server's results, sent to server 0 when it asks for them.

Server 0 ends its loop, then asks each other server in turn (COLLECT) for its final slice, its
version and staleness counts, and its kept snapshots, four buffers as in training (no pickle).
The other server may still be serving when asked (it noticed a lost worker later than server 0
did), so its loop takes the request too; either side gives up with
:class:`~.protocol.ServerLost` when the other falls silent.
"""

from __future__ import annotations

import time

import torch

from ..comm.polling import Backoff
from .protocol import COLLECT, NAMES, SHARD, SNAPSHOT_VERSIONS, SNAPSHOTS, STATS, ServerLost, wait_until


def send(server) -> None:
    """(another server) Wait for server 0 to ask, unless it has already, and send it the results."""
    comm, cfg = server.comm, server.cfg
    deadline = time.monotonic() + cfg.worker_timeout + cfg.server_timeout
    while not server.collect:
        status = comm.iprobe(0, COLLECT)
        if status is not None:
            wait_until(comm.irecv(server.empty, 0, COLLECT), time.monotonic() + cfg.server_timeout)
            server.collect = True
        elif time.monotonic() > deadline:
            raise ServerLost(f"server rank {comm.rank}: server rank 0 never asked for the results")
        else:
            time.sleep(1e-3)
    counts = [server.staleness.get(t, 0) for t in range(max(server.staleness, default=-1) + 1)]
    stats = torch.tensor([server.clock.version, *counts], dtype=torch.int64)
    versions = torch.tensor([v for v, _, _ in server.snapshots], dtype=torch.int64)
    kept = torch.stack([s for _, _, s in server.snapshots]).reshape(-1) if server.snapshots else server.empty
    sends = [
        comm.isend(buf, 0, tag)
        for buf, tag in ((server.shard, SHARD), (stats, STATS), (versions, SNAPSHOT_VERSIONS), (kept, SNAPSHOTS))
    ]
    deadline = time.monotonic() + cfg.server_timeout
    if not all(wait_until(s, deadline) for s in sends):
        raise ServerLost(f"server rank {comm.rank}: server rank 0 did not take the results")


def collect(comm, cfg, server: int, dtype: torch.dtype) -> dict:
    """(server 0) Ask another server for its results and receive them: tag -> buffer."""
    request = torch.empty(0, dtype=dtype)
    try:
        asked = comm.isend(request, server, COLLECT)
    except RuntimeError as e:  # MPI reports the server's death (mpi4py's MPI.Exception)
        raise ServerLost(f"asking server rank {server} for its results failed: {e}") from None
    wait = cfg.worker_timeout + 2 * cfg.server_timeout  # it may still be serving
    out = {}
    for tag, kind in ((SHARD, dtype), (STATS, torch.int64), (SNAPSHOT_VERSIONS, torch.int64), (SNAPSHOTS, dtype)):
        status = _await(comm, server, tag, kind, wait)
        buf = torch.empty(status.count, dtype=kind)
        if not wait_until(comm.irecv(buf, server, tag), time.monotonic() + cfg.server_timeout):
            raise ServerLost(f"server rank {server} stopped sending its results")
        out[tag] = buf
    wait_until(asked, time.monotonic() + cfg.server_timeout)  # it answered, so it has the request
    return out


def _await(comm, source: int, tag: int, dtype, seconds: float):
    deadline, backoff = time.monotonic() + seconds, Backoff()
    while (status := comm.iprobe(source, tag, dtype)) is None:
        if time.monotonic() > deadline:
            raise ServerLost(f"server rank {source} sent no {NAMES[tag]} within {seconds:g} s: it is gone")
        backoff.pause()
    return status
