"""The asynchronous run's settings: one frozen dataclass, checked on construction, exposed as flags.

Each field is a flag (``parser.add_flags(AsyncConfig)``, :mod:`mpi_sgd.args`). What depends on
the world size (enough ranks for the servers, a staleness bound the workers can meet) is checked
by :meth:`AsyncConfig.check_world`, which every rank calls with the size the launcher announced,
before any communication: a bad value fails everywhere the same way.

At world size 1 the one rank is both the server and the worker: every gradient is applied on
the version it was computed on (staleness 0), which is plain SGD with momentum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..args import flag as _flag

UNBOUNDED = -1


@dataclass(frozen=True)
class AsyncConfig:
    servers: int = _flag(1, "server ranks (0..k-1), the parameters sharded evenly across them; the rest are workers")
    lr: float = _flag(0.05, "learning rate of every applied gradient (of one worker's batch)")
    momentum: float = _flag(0.0, "SGD momentum, applied by the servers in the order gradients arrive")
    batch_size: int = _flag(32, "samples per gradient (one worker's batch)")
    evaluations: int = _flag(1000, "gradients computed and applied in total, by all workers together")
    max_staleness: int = _flag(
        UNBOUNDED,
        "bound s on staleness: no gradient is applied more than s versions late; a push that would make "
        "that impossible for a slower worker waits (-1: unbounded; needs s >= workers - 1)",
    )
    lr_by_staleness: bool = _flag(False, "divide the learning rate by max(tau, 1) (Zhang, Gupta, Lian & Liu 2015)")
    worker_timeout: float = _flag(10.0, "seconds of silence after which a server declares a worker lost")
    server_timeout: float = _flag(5.0, "seconds without a reply after which a worker declares a server lost")
    heartbeat: float = _flag(
        1.0, "seconds between the 'still holding you' messages to workers kept waiting (< both timeouts)"
    )
    straggler_ms: float = _flag(0.0, "slow one worker down: it sleeps this long after each gradient")
    straggler_rank: int = _flag(UNBOUNDED, "the rank --straggler-ms slows (-1: the last rank)")
    snapshot_every: int = _flag(0, "keep the parameters every this many versions, for loss curves (0: never)")
    seed: int = _flag(0, "seed for the data order (the model is the caller's)")

    def __post_init__(self):
        def check(ok: bool, message: str):
            if not ok:
                raise ValueError(message)

        check(self.servers >= 1, f"--servers must be at least 1, got {self.servers}")
        check(self.lr > 0 and math.isfinite(self.lr), f"--lr must be a positive number, got {self.lr}")
        check(0 <= self.momentum < 1, f"--momentum must be in [0, 1), got {self.momentum}")
        check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        check(self.evaluations >= 1, f"--evaluations must be at least 1, got {self.evaluations}")
        check(self.max_staleness >= UNBOUNDED, f"--max-staleness must be -1 or >= 0, got {self.max_staleness}")
        for name in ("worker_timeout", "server_timeout", "heartbeat"):
            value = getattr(self, name)
            check(value > 0 and math.isfinite(value), f"--{name.replace('_', '-')} must be positive, got {value}")
        check(
            self.heartbeat < self.server_timeout,
            f"--heartbeat ({self.heartbeat}) must be shorter than --server-timeout ({self.server_timeout}), "
            "or a worker kept waiting would give up on a live server",
        )
        check(
            self.heartbeat < self.worker_timeout,
            f"--heartbeat ({self.heartbeat}) must be shorter than --worker-timeout ({self.worker_timeout}): a "
            "worker one server keeps waiting passes each heartbeat on to the others, its only word to them",
        )
        check(self.straggler_ms >= 0, f"--straggler-ms must be >= 0, got {self.straggler_ms}")
        check(self.snapshot_every >= 0, f"--snapshot-every must be >= 0, got {self.snapshot_every}")

    @property
    def bounded(self) -> bool:
        return self.max_staleness != UNBOUNDED

    def workers(self, size: int) -> int:
        """Worker ranks: all but the servers; at world size 1 the one rank works as well as serves."""
        return 1 if size == 1 else size - self.servers

    def first_worker(self, size: int) -> int:
        return 0 if size == 1 else self.servers

    def straggler(self, size: int) -> int | None:
        """The rank slowed by --straggler-ms, or None."""
        if not self.straggler_ms:
            return None
        return size - 1 if self.straggler_rank == UNBOUNDED else self.straggler_rank

    def check_world(self, size: int) -> None:
        """Raise ValueError unless this configuration can run on ``size`` ranks."""
        workers = self.workers(size)
        if workers < 1 or size == 1 < self.servers:
            raise ValueError(
                f"--servers {self.servers} needs at least {self.servers + 1} ranks (the servers and a worker), "
                f"got {size}; as one process, the one rank is server and worker (--servers 1)"
            )
        if self.bounded and self.max_staleness < workers - 1:
            raise ValueError(
                f"--max-staleness {self.max_staleness} cannot be met by {workers} workers: a server applies one "
                f"gradient at a time, so of {workers} gradients computed on the same version the last is applied "
                f"{workers - 1} versions late; use --max-staleness {workers - 1} or more"
            )
        straggler, first = self.straggler(size), self.first_worker(size)
        if straggler is not None and not first <= straggler < size:
            raise ValueError(f"--straggler-rank {straggler} is not a worker: workers are ranks {first}..{size - 1}")
