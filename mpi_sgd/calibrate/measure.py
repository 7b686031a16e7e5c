"""Measuring on the machine at hand: the all-reduce sweep, γ, and T_comp (the trainer's own step)."""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Sequence

import numpy as np

from ..perfmodel import Network
from ..timing import WARMUP_STEPS, time_interleaved
from .fit import fit_line, fit_network
from .records import Calibration, StepTiming, SweepPoint


def sweep_sizes(min_bytes: int = 4, max_bytes: int = 16 << 20, factor: int = 4) -> list[int]:
    """4 B, 16 B, ... up to ``max_bytes``: a factor of 4 covers the range in half the time of 2."""
    sizes, n = [], min_bytes
    while n <= max_bytes:
        sizes.append(n)
        n *= factor
    return sizes


def _iterations(nbytes: int) -> int:
    """About 32 MiB moved per size, between 10 and 200 calls: small sizes need many to beat the clock."""
    return max(10, min(200, (32 << 20) // max(nbytes, 1)))


def measure_allreduce(comm, sizes: Sequence[int], rounds: int = 5, algorithm: str = "ring") -> list[SweepPoint]:
    """Time ``comm.allreduce`` on float32 torch tensors of each size, the OSU way.

    Per size: warm-up calls discarded, then ``rounds`` blocks each opened by a barrier and timed
    with ``comm.wtime()``; each rank keeps its median block and min/avg/max across ranks are
    recorded (:func:`mpi_sgd.timing.time_interleaved`).
    """
    from ..comm.buffers import zeros

    points = []
    for nbytes in sizes:
        # zeros: sums stay finite however often we add; allocated as the trainer allocates its
        # gradient buffers (huge pages from 4 MiB), or the fit prices memory training never uses
        buf = zeros(max(1, nbytes // 4))
        iters = _iterations(nbytes)
        st = time_interleaved(comm, {"seam": lambda buf=buf: comm.allreduce(buf)}, iters, max(2, iters // 10), rounds)
        st = st["seam"]
        points.append(SweepPoint(buf.numel() * 4, comm.size, st.min, st.avg, st.max, algorithm))
    return points


def measure_gamma(sizes: Sequence[int] = (1 << 22, 1 << 24, 1 << 26), repeats: int = 5) -> float:
    """γ, seconds per byte reduced: the slope of ``numpy.add(a, b, out=a)`` time against bytes.

    The default sizes (4 to 64 MiB) are gradient-sized and larger than the caches: below a few
    MiB the arrays stay in cache and the add runs several times faster than it will on real
    gradients.
    """
    times = []
    for nbytes in sizes:
        a, b = np.zeros(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
        np.add(a, b, out=a)  # first touch pays page faults; not part of γ
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.add(a, b, out=a)
            samples.append(time.perf_counter() - t0)
        times.append(statistics.median(samples))
    return fit_line(sizes, times)[1]


def measure_step(
    layers: Sequence[int],
    batch: int,
    warmup: int = WARMUP_STEPS,
    iterations: int = 20,
    strategy: str = "flat",
    min_seconds: float = 0.5,
) -> StepTiming:
    """Median seconds of the trainer's step (forward, backward, SGD with momentum) of an MLP of
    widths ``layers`` on a random batch, at one rank: ``iterations`` steps after the warm-up, and
    more until they took ``min_seconds`` (at most 2000). A small model's step is so short that a
    fixed count of them can be a sample shorter than one descheduling on a shared host.

    It runs :func:`mpi_sgd.trainer.train_step` with gradients laid out as ``strategy`` lays them
    out: the figure is the ``t_comp`` training reports, not a look-alike loop's. The layout
    matters: flat and bucketed gradients live in a buffer that is zeroed and accumulated into every
    step, a pass over the gradients that a loop letting autograd hand over fresh ones would not pay.
    """
    import torch

    from ..comm.backends.local import LocalComm
    from ..config import TrainConfig
    from ..gradsync import make
    from ..models import MLP
    from ..trainer import make_optimizer, train_step

    cfg = TrainConfig(batch_size=batch, strategy=strategy, progress=False)
    model = MLP(tuple(layers))
    x, y = torch.randn(batch, layers[0]), torch.randint(0, layers[-1], (batch,))
    sync, optimizer = make(strategy, model, LocalComm(), cfg.bucket_mb), make_optimizer(cfg, model)
    for _ in range(warmup):
        train_step(model, optimizer, sync, x, y)
    steps: list[float] = []
    total = 0.0
    while len(steps) < iterations or (total < min_seconds and len(steps) < 2000):
        steps.append(train_step(model, optimizer, sync, x, y).t_comp)
        total += steps[-1]
    params = sum(p.numel() for p in model.parameters())
    name = "mlp " + "-".join(map(str, layers))
    return StepTiming(statistics.median(steps), batch, params, name, torch.get_num_threads())


def calibrate(
    comm,
    sizes: Sequence[int] | None = None,
    layers: Sequence[int] | None = None,
    batch: int = 64,
    algorithm: str = "ring",
    strategy: str = "flat",
    measure_network: bool = True,
) -> Calibration:
    """Measure T_comp on every rank (the slowest sets the pace) and, at two or more ranks, α, β, γ.

    Collective: every rank must call it. At one rank, or with ``measure_network=False`` (T_comp at this
    R, the network taken from a calibration at another), only T_comp and γ are measured, and the
    network is left at zero cost; the caller decides what to do about that. ``layers`` are the
    widths of the MLP whose step is timed (``--model mlp``'s by default).
    """
    import torch  # here, not above: reading a calibration needs no torch

    from ..launch import pin_threads
    from ..models import BENCHMARK_MLP

    pin_threads(comm.local_size)
    torch.manual_seed(0)
    step = measure_step(BENCHMARK_MLP if layers is None else layers, batch, strategy=strategy)
    slowest = max(comm.allgather_obj(step.seconds))
    step = StepTiming(slowest, step.batch, step.params, step.model, step.torch_threads)
    # Every rank must fit with the same γ to end with the same network; ranks reduce concurrently in
    # training too, so their mean is the figure that applies.
    gammas = comm.allgather_obj(measure_gamma())
    gamma = sum(gammas) / len(gammas)
    sweep: list[SweepPoint] = []
    network = Network(0.0, 0.0, gamma, "one rank: nothing measured" if comm.size == 1 else "not measured")
    if comm.size > 1 and measure_network:
        sweep = measure_allreduce(comm, sizes or sweep_sizes(), algorithm=algorithm)
        network = fit_network(sweep, gamma=gamma, name=f"measured, {comm.size} ranks, {comm.backend}")
    meta = {
        "host": platform.node(),
        "ranks": comm.size,
        "local_ranks": comm.local_size,
        "backend": comm.backend,
        "strategy": strategy,  # the gradient layout T_comp was timed with
        "mpi": _mpi_library(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return Calibration(network, algorithm, step, tuple(sweep), meta)


def _mpi_library() -> str:
    try:
        from mpi4py import MPI

        return MPI.Get_library_version().splitlines()[0].strip()
    except Exception:  # no MPI here: the calibration still records the rest
        return "none"
