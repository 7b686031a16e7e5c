"""Every rank's replica of the model starts the same: seeded alike, built, rank 0's copy broadcast.

Data parallelism needs identical replicas at the start. The same seed on every rank builds the
same model; the broadcast from rank 0 makes it certain, whatever a library draws from the RNG on
one rank only ([S-SGD]'s ``sync_initial_weights``, as a collective instead of R-1 sends). After
that each rank reseeds with ``seed + rank``: what must differ between ranks (dropout masks) then
differs, and a run is still repeatable.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def broadcast_parameters(model: nn.Module, comm, root: int = 0) -> None:
    """Give every rank the root's parameters and buffers, so all replicas start identical.

    Same-seed initialisation would do it too, until someone initialises with ``seed + rank`` or
    a library draws from the RNG in a rank-dependent way; one broadcast costs little and makes it
    certain.
    """
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            comm.broadcast(t.data, root)


def replicate(build: Callable[[], nn.Module], comm, seed: int, check: Callable[[], None] | None = None) -> nn.Module:
    """``build()`` under ``torch.manual_seed(seed)`` on every rank, rank 0's copy broadcast to all,
    then ``torch.manual_seed(seed + rank)``; returns this rank's replica.

    ``check``, if given, runs between building and the broadcast: the place for the ranks to
    compare what the broadcast's shapes depend on (:func:`mpi_sgd.agree.check_start`), after a
    model that cannot be built has failed on every rank without any communication.
    """
    torch.manual_seed(seed)
    model = build()
    if check is not None:
        check()
    broadcast_parameters(model, comm)
    torch.manual_seed(seed + comm.rank)
    return model
