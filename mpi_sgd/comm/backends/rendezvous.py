"""torch.distributed's rendezvous carried by MPI: no MASTER_ADDR, MASTER_PORT, RANK or WORLD_SIZE.

``dist.init_process_group`` first meets the other processes through a key-value store, by default
through ``env://``, which reads those four variables. Under ``mpiexec`` MPI already knows rank and
size and can carry the rest: rank 0 starts a ``TCPStore`` on a port the kernel picks, broadcasts
its address and port over ``MPI.COMM_WORLD``, and everyone else connects. No port is guessed, so
two jobs on one host cannot collide.

:func:`install` makes ``env://`` do that whenever ``MASTER_ADDR``/``MASTER_PORT`` are not set,
for any backend (gloo included); with them set, torch's own handler runs unchanged, so a
``torchrun`` launch behaves as before. torch offers no public way to extend a scheme that is
already registered, hence the one assignment into ``torch.distributed.rendezvous``.

A job that rendezvoused here also pauses for a moment at exit (:func:`_let_backend_threads_finish`):
gloo's worker threads drop a finished collective's tensors just after ``wait()`` returns, and
dropping a tensor that Python made takes the GIL. A thread that asks for the GIL once Python has
begun to shut down is ended on the spot, which ends the process ("terminate called without an
active exception", rank N aborted after a job that worked). Seen at exit of a DDP script under gloo,
about one run in three under Intel MPI, more rarely under MPICH.
"""

from __future__ import annotations

import atexit
import importlib
import os
import socket
import time
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout


def routable_address() -> str:
    """An address of this host that the other hosts can reach (not 127.0.1.1 from /etc/hosts)."""
    host = socket.gethostname()
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        addr = "127.0.0.1"
    if addr.startswith("127."):
        # Ask the kernel which interface it would use to leave the host; no packet is sent.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing lookup only
                addr = s.getsockname()[0]
            except OSError:
                pass
    return addr


def mpi_store(timeout: timedelta, rank: int | None = None, world_size: int | None = None):
    """``(store, rank, world_size)`` for this MPI job: a TCPStore on rank 0, found through MPI.

    ``rank``/``world_size``, if the caller gave them, must be MPI's own; a mismatch is an error
    here rather than a hang later.
    """
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    for given, actual, what in ((rank, world.rank, "rank"), (world_size, world.size, "world_size")):
        if given not in (None, -1, actual):
            raise ValueError(f"{what}={given} given, but MPI says {actual}; leave it out under mpiexec")
    store = tcp_store(world.rank == 0, world.size, lambda obj: world.bcast(obj, root=0), timeout)
    return store, world.rank, world.size


def tcp_store(is_root: bool, size: int, bcast, timeout: timedelta):
    """A TCPStore served by the root on a port the kernel picks, its address carried by ``bcast``.

    Port 0 means no port is guessed, so none can be taken between choosing and binding it (a
    free-port probe that closes its socket first has exactly that race).
    """
    store = None
    if is_root:
        store = dist.TCPStore(routable_address(), 0, size, True, timeout, wait_for_workers=False)
    addr, port = bcast((routable_address(), store.port) if is_root else None)
    return store or dist.TCPStore(addr, port, size, False, timeout)


# The module (``torch.distributed.rendezvous`` the attribute is the function of that name).
_rdzv = importlib.import_module("torch.distributed.rendezvous")
_torch_env_handler = _rdzv._rendezvous_handlers["env"]


# Long enough for a thread already waiting on the GIL to be scheduled, even with ranks
# oversubscribing the cores; short beside a job's start-up.
EXIT_PAUSE_S = 0.05


def _let_backend_threads_finish() -> None:
    """Sleep briefly, releasing the GIL, while Python is still whole (registered at rendezvous)."""
    time.sleep(EXIT_PAUSE_S)


def _env_or_mpi(url: str, timeout: timedelta = default_pg_timeout, **kwargs):
    atexit.unregister(_let_backend_threads_finish)  # once, however many groups the job makes
    atexit.register(_let_backend_threads_finish)
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        yield from _torch_env_handler(url, timeout, **kwargs)
        return
    query = {k: int(v[-1]) for k, v in parse_qs(urlparse(url).query).items() if k in ("rank", "world_size")}
    rank = query.get("rank", os.environ.get("RANK"))
    size = query.get("world_size", os.environ.get("WORLD_SIZE"))
    yield mpi_store(timeout, None if rank is None else int(rank), None if size is None else int(size))
    raise RuntimeError("the MPI rendezvous cannot be repeated; restart the job")


def install() -> None:
    """Let ``env://`` rendezvous through MPI when MASTER_ADDR/MASTER_PORT are not set (idempotent)."""
    _rdzv._rendezvous_handlers["env"] = _env_or_mpi
