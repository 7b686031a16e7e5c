"""``train``: every rank of the job calls it; ranks 0..k-1 serve, the others work."""

from __future__ import annotations

import atexit
import os
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from .. import data, optimizers
from ..gcpause import frozen_heap
from ..replicas import broadcast_parameters
from . import results
from .config import AsyncConfig
from .flat import shards
from .protocol import SHARD, SNAPSHOT_VERSIONS, SNAPSHOTS, STATS, ServerLost
from .server import Server
from .worker import Worker


@dataclass
class Result:
    """What one rank knows after :func:`train`; server 0 (the root) knows the most.

    * ``applied``: gradients applied (server 0's version); ``staleness``: their staleness counts
      on server 0, ``staleness_by_server`` the same for every server (root only);
    * ``pushes_by_worker``: gradients applied per worker rank (root); ``steps``: gradients this
      worker computed (workers);
    * ``lost``: rank -> why, for workers given up on (and, on a worker, ``{-1: ...}`` if a server
      said a rank was lost); ``seconds``: server 0's time from start to the last reply;
    * ``snapshots``: ``(version, seconds, flat parameters)`` every ``snapshot_every`` versions (root).
    """

    role: str
    rank: int
    applied: int = 0
    seconds: float = 0.0
    steps: int = 0
    staleness: Counter = field(default_factory=Counter)
    staleness_by_server: list = field(default_factory=list)
    pushes_by_worker: Counter = field(default_factory=Counter)
    lost: dict = field(default_factory=dict)
    snapshots: list = field(default_factory=list)


def train(comm, model: torch.nn.Module, dataset: data.Dataset, cfg: AsyncConfig) -> Result:
    """Asynchronous SGD of ``model`` on ``dataset``: ``cfg.evaluations`` gradients, applied as they come.

    Call it on every rank with the same model and data. Afterwards ``model`` holds the final
    parameters on server 0 and on every worker (other servers hold only their slice). The call
    starts with a broadcast of the initial parameters from rank 0 and a barrier once every rank
    is set up; the training loop has no collective at all.

    If a rank was lost on the way, this process ends without ``MPI_Finalize`` (which would wait
    for the lost rank forever) when the script ends: output is flushed and the exit status is 0.
    One gap is left: a worker that dies *after* taking the final parameters goes unnoticed, and
    the others then wait for it in ``MPI_Finalize`` until the launcher gives up (``MPIEXEC_TIMEOUT``).

    At world size 1 the one rank serves and works (:func:`_alone`): plain SGD, no messages.
    """
    cfg.check_world(comm.size)
    data.check_size(len(dataset), cfg.workers(comm.size), cfg.batch_size)
    if comm.size == 1:
        with frozen_heap():
            return _alone(model, dataset, cfg)
    broadcast_parameters(model, comm)
    bounds = shards(sum(p.numel() for p in model.parameters()), cfg.servers)
    # A server's full collection keeps every worker waiting for its answer (mpi_sgd.gcpause).
    with frozen_heap():
        if comm.rank < cfg.servers:
            server = Server(comm, parameters_to_vector(model.parameters()).detach(), cfg, comm.rank, bounds)
            comm.barrier()  # set-up can take seconds (first imports); timeouts count from here
            result = _serve(comm, model, cfg, server)
        else:
            worker = Worker(comm, model, dataset, cfg, bounds)
            comm.barrier()
            result = _work(comm, worker)
    _at_exit(bool(result.lost))
    return result


def _alone(model: torch.nn.Module, dataset: data.Dataset, cfg: AsyncConfig) -> Result:
    """Server and worker in one rank: each gradient is applied on the version it was computed on.

    Staleness is always 0, so this is SGD with momentum on the batches a lone worker draws (the
    trainer's partition at one rank, epoch after epoch), applied by the server's rule, which is
    ``torch.optim.SGD``'s: v = momentum * v + g, then p -= lr * v (--lr-by-staleness divides by
    max(0, 1) = 1).
    """
    params = list(model.parameters())
    optimizer = optimizers.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
    loss_fn = F.cross_entropy if dataset.classification else F.mse_loss
    delay = cfg.straggler_ms / 1e3 if cfg.straggler(1) == 0 else 0.0
    result = Result("server", 0, staleness=Counter({0: cfg.evaluations}), pushes_by_worker=Counter({0: 0}))
    start, epoch = time.monotonic(), 0
    if cfg.snapshot_every:
        result.snapshots.append((0, 0.0, parameters_to_vector(params).detach().clone()))
    while result.applied < cfg.evaluations:
        for idx in data.rank_batches(len(dataset), 0, 1, cfg.batch_size, epoch, cfg.seed):
            optimizer.zero_grad()
            loss_fn(model(dataset.x[idx]), dataset.y[idx]).backward()
            if delay:
                time.sleep(delay)  # --straggler-ms: the one worker is the slow one
            optimizer.step()
            result.applied += 1
            if cfg.snapshot_every and result.applied % cfg.snapshot_every == 0:
                result.snapshots.append(
                    (result.applied, time.monotonic() - start, parameters_to_vector(params).detach().clone())
                )
            if result.applied == cfg.evaluations:
                break
        epoch += 1
    if cfg.snapshot_every and result.snapshots[-1][0] != result.applied:  # the last version too, as a server keeps
        result.snapshots.append(
            (result.applied, time.monotonic() - start, parameters_to_vector(params).detach().clone())
        )
    result.pushes_by_worker[0] = result.steps = result.applied
    result.seconds = time.monotonic() - start
    result.staleness_by_server = [result.staleness]
    return result


def _serve(comm, model, cfg, server: Server) -> Result:
    server.run()
    result = Result(
        "server",
        comm.rank,
        server.clock.version,
        server.seconds,
        staleness=Counter(server.staleness),
        pushes_by_worker=server.applied_by,
        lost=dict(server.lost),
    )
    if comm.rank != 0:
        return result
    shards_, counts, kept = [server.shard.detach()], [server.staleness], [server.snapshots]
    for other in range(1, cfg.servers):
        got = results.collect(comm, cfg, other, server.shard.dtype)
        shards_.append(got[SHARD])
        counts.append(Counter({t: int(n) for t, n in enumerate(got[STATS][1:].tolist()) if n}))
        times = {v: t for v, t, _ in server.snapshots}
        flat = got[SNAPSHOTS].reshape(len(got[SNAPSHOT_VERSIONS]), -1) if len(got[SNAPSHOT_VERSIONS]) else []
        kept.append([(v, times.get(v), s) for v, s in zip(got[SNAPSHOT_VERSIONS].tolist(), flat, strict=True)])
    with torch.no_grad():
        vector_to_parameters(torch.cat(shards_), model.parameters())
    result.staleness_by_server = counts
    # A version every server reached (a worker lost between its pushes leaves them one apart).
    common = set.intersection(*({v for v, _, _ in k} for k in kept))
    by_version = [{v: s for v, _, s in k} for k in kept]
    result.snapshots = [(v, t, torch.cat([b[v] for b in by_version])) for v, t, _ in server.snapshots if v in common]
    return result


def _work(comm, worker: Worker) -> Result:
    try:
        worker.run()
    except ServerLost as e:
        # Without a server the job cannot go on: end all of it now, saying why.
        sys.stderr.write(f"mpi_sgd: {e}; ending the job\n")
        sys.stderr.flush()
        time.sleep(0.2)  # let the launcher forward the line before the abort tears its pipes down
        comm.abort(1)
    except Exception:
        # A worker's own failure is not the job's: leave quietly and let the servers carry on
        # (they notice the silence). Under a launcher that cleans up after a failed rank (hydra's
        # default) the job ends anyway; with `mpiexec -disable-auto-cleanup` it does not.
        sys.stderr.write(
            f"mpi_sgd: worker rank {comm.rank} failed; leaving, the servers carry on without it\n"
            f"{traceback.format_exc()}"
        )
        sys.stderr.flush()
        os._exit(1)
    lost = {-1: "a server reported a lost rank"} if worker.lost else {}
    return Result("worker", comm.rank, steps=worker.steps, lost=lost)


def _at_exit(lost: bool) -> None:
    """How this process leaves once the script ends: see :func:`train`."""
    if lost:
        atexit.register(_leave_now)


def _leave_now() -> None:
    # Python-level exit handlers run before mpi4py's MPI_Finalize, which would wait for the lost
    # rank forever; leaving from here skips it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def mean_loss(model: torch.nn.Module, dataset: data.Dataset, batch: int = 4096) -> float:
    """Mean loss over the whole dataset (cross-entropy for classes, MSE for regression)."""
    loss_fn = F.cross_entropy if dataset.classification else F.mse_loss
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(dataset), batch):
            x, y = dataset.x[i : i + batch], dataset.y[i : i + batch]
            total += loss_fn(model(x), y, reduction="sum").item() / (1 if dataset.classification else y.shape[1])
    return total / len(dataset)
