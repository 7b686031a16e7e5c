"""Calibrate the performance model on the machine at hand: α, β, γ and T_comp, saved as JSON.

* **α, β** come from an all-reduce sweep through the communicator seam (the call the trainer
  makes), fitted by least squares to the α-β-γ cost of an algorithm (:mod:`mpi_sgd.perfmodel`).
  It needs at least two ranks: run under ``mpiexec``.
* **γ** comes from timing the reduction itself (``numpy.add`` into a buffer) on one rank. It
  must be measured apart: ring and Rabenseifner all-reduce move 2(p−1)/p·n bytes and reduce
  (p−1)/p·n at every p, so in their sweeps β and γ always appear in the ratio 2:1 and no fit
  can tell them apart.
* **T_comp** is one training step (forward, backward, SGD step) of a model on one batch, timed
  on every rank at once with each rank's share of the cores, as in training. The step is the
  trainer's own (:meth:`mpi_sgd.trainer.Trainer._run_batch` on a one-rank communicator), so
  T_comp is by construction the ``t_comp`` a training run reports.

The fit weights each point by 1/t (it minimises relative error): sizes span six orders of
magnitude, and an unweighted fit would let the largest messages decide α as well. Where the
sweep has them, β (and γ) come from the sizes within 64× of the largest and α from the smaller
ones: MPI switches protocol between the two ends, and the gradients that T_sync is about are
large messages.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .perfmodel import ALLREDUCE_ALGORITHMS, Compute, Network, allreduce_coefficients

FORMAT = "mpi_sgd.calibration/1"

# What-if networks: link rate from the standard, latency and achievable share of the link as
# typically reported by OSU micro-benchmarks (MPI over TCP or verbs) and nccl-tests (NVLink).
# Order-of-magnitude figures for comparing options, not a substitute for --calibrate.
# gamma: summing float32 on a CPU core streams at ~10 GB/s; on a GPU from HBM at ~1 TB/s.
PRESETS = {
    # IEEE 802.3ab, 1 Gb/s = 125 MB/s; ~117 MB/s TCP goodput; MPI over TCP ~50 us per message.
    "1gbe": Network.from_link(50e-6, 117e6, gamma=1e-10, name="1 Gb Ethernet (TCP)"),
    # IEEE 802.3ae, 10 Gb/s = 1.25 GB/s; ~1.1 GB/s goodput; ~20 us per message over TCP.
    "10gbe": Network.from_link(20e-6, 1.1e9, gamma=1e-10, name="10 Gb Ethernet (TCP)"),
    # InfiniBand EDR 4x, 100 Gb/s = 12.5 GB/s; ~12 GB/s with verbs; ~1.5 us MPI latency.
    "ib100": Network.from_link(1.5e-6, 12e9, gamma=1e-10, name="100 Gb InfiniBand EDR"),
    # NVLink 3 (A100): 300 GB/s each way per GPU; nccl-tests reach ~230 GB/s busbw; ~5 us per step.
    "nvlink": Network.from_link(5e-6, 230e9, gamma=1e-12, name="NVLink 3 (A100, NCCL)"),
}


@dataclass(frozen=True)
class SweepPoint:
    """Seconds per all-reduce of ``nbytes`` at ``ranks``: min/avg/max over ranks of each rank's median."""

    nbytes: int
    ranks: int
    min_s: float
    avg_s: float
    max_s: float
    algorithm: str = "ring"  # the cost formula this point is fitted with

    def __post_init__(self):
        if self.nbytes < 1 or self.ranks < 1 or not 0 <= self.min_s <= self.avg_s <= self.max_s:
            raise ValueError(f"not a sweep measurement: {self}")
        if self.algorithm not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}")


@dataclass(frozen=True)
class StepTiming:
    """T_comp: seconds per training step of ``model`` (``params`` parameters) at per-rank ``batch``."""

    seconds: float
    batch: int
    params: int
    model: str
    torch_threads: int = 1

    def __post_init__(self):
        if not self.seconds > 0 or self.batch < 1 or self.params < 1:
            raise ValueError(f"not a step measurement: {self}")

    @property
    def grad_bytes(self) -> int:
        return 4 * self.params  # float32 gradients


@dataclass(frozen=True)
class Calibration:
    network: Network
    algorithm: str = "ring"
    step: StepTiming | None = None
    sweep: tuple[SweepPoint, ...] = ()
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.algorithm not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}")

    def compute(self) -> Compute:
        if self.step is None:
            raise ValueError("this calibration has no T_comp measurement")
        return Compute(self.step.seconds, self.step.batch)

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "network": asdict(self.network),
            "algorithm": self.algorithm,
            "step": asdict(self.step) if self.step else None,
            "sweep": [asdict(p) for p in self.sweep],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        if d.get("format") != FORMAT:
            raise ValueError(f"not a calibration file (format {d.get('format')!r}, expected {FORMAT!r})")
        return cls(
            Network(**d["network"]),
            d["algorithm"],
            StepTiming(**d["step"]) if d.get("step") else None,
            tuple(SweepPoint(**p) for p in d.get("sweep", ())),
            d.get("meta", {}),
        )

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        return cls.from_dict(json.loads(Path(path).read_text()))


# -- fitting ------------------------------------------------------------------------------------
def _nonneg_lstsq(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """min ||a·x − t|| with x >= 0, by dropping negative components and refitting (3 unknowns at most).

    A negative latency or bandwidth is noise, not physics: on a fast shared-memory link α can
    be lost in the scatter of the small-message times.
    """
    active = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        x[active] = np.linalg.lstsq(a[:, active], t, rcond=None)[0]
        negative = [i for i in active if x[i] < 0]
        if not negative:
            return x
        active.remove(min(negative, key=lambda i: x[i]))


# Sizes within this factor of the largest decide the bandwidth terms (see fit_network).
LARGE_END = 64


def fit_network(points: Sequence[SweepPoint], gamma: float | None = None, name: str = "fitted") -> Network:
    """Least-squares α, β (and γ unless given) from all-reduce timings, each point's ``avg_s``.

    With ``gamma`` given, its share ``c·γ`` is subtracted and only α and β are fitted; with
    ``gamma=0`` β absorbs the reduction (an "effective β"). With ``gamma=None`` all three are
    fitted, which needs points whose β and γ coefficients are not proportional (recursive
    doubling beside the ring, say); otherwise this raises rather than return an arbitrary split.
    """
    if len(points) < 2:
        raise ValueError("need at least two sweep points to fit α and β")
    if any(p.ranks < 2 for p in points):
        raise ValueError("an all-reduce at one rank moves nothing: sweep at two or more ranks (mpiexec -n 2)")
    coef = [allreduce_coefficients(p.algorithm, p.nbytes, p.ranks) for p in points]
    t = np.array([p.avg_s for p in points], dtype=float)
    if np.any(t <= 0):
        raise ValueError("all-reduce times must be positive (was the sweep run at one rank?)")
    a = np.array([[c.latency, c.bandwidth, c.compute] for c in coef], dtype=float)
    if gamma is not None:
        t = t - gamma * a[:, 2]
        a = a[:, :2]
    if np.linalg.matrix_rank(a / a.max(axis=0).clip(min=1e-300)) < a.shape[1]:
        raise ValueError(
            "β and γ cannot be told apart from these points (their coefficients are "
            "proportional); measure γ with measure_gamma() and pass it, or pass gamma=0"
        )
    w = 1.0 / np.array([p.avg_s for p in points])  # relative error: every size counts
    x = _nonneg_lstsq(a * w[:, None], t * w)
    nbytes = np.array([p.nbytes for p in points])
    large = nbytes >= nbytes.max() / LARGE_END
    if large.sum() > a.shape[1] and (~large).any() and np.linalg.matrix_rank(a[large]) == a.shape[1]:
        # Bandwidth from the large end, latency from the small end. MPI changes protocol in
        # between (eager to rendezvous, another algorithm), and one straight line through six
        # decades of sizes follows the many small points: over TCP here it under-predicted
        # 4-16 MiB all-reduces by a third, the sizes where gradients are. So β (and γ) come
        # from the largest sizes alone, with an intercept of their own, and α from the rest.
        x = _nonneg_lstsq(a[large] * w[large, None], t[large] * w[large])
        rest = t[~large] - a[~large, 1:] @ x[1:]
        x[0] = max(0.0, float(np.median(rest / a[~large, 0])))
    alpha, beta = float(x[0]), float(x[1])
    return Network(alpha, beta, float(x[2]) if gamma is None else gamma, name)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of y = a + b·x, weighted by 1/y like :func:`fit_network`."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    w = 1.0 / y
    a = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    c0, c1 = _nonneg_lstsq(a, y * w)
    return float(c0), float(c1)


# -- measuring ----------------------------------------------------------------------------------
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
    recorded (:func:`mpi_sgd.bench.timing.time_interleaved`).
    """
    from .bench.timing import time_interleaved
    from .comm.buffers import zeros

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


def mlp(sizes: Sequence[int] = (784, 1024, 1024, 10)):
    """Linear layers with ReLU between them: a model whose size one flag changes."""
    import torch.nn as nn

    if len(sizes) < 2:
        raise ValueError(f"an MLP needs at least an input and an output width, got {list(sizes)}")
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=False)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def measure_step(
    model,
    batch: int,
    in_features: int,
    classes: int,
    warmup: int = 5,
    iterations: int = 20,
    name: str = "",
    strategy: str = "flat",
) -> StepTiming:
    """Median seconds of the trainer's step (forward, backward, SGD with momentum) on random data.

    It runs :class:`mpi_sgd.trainer.Trainer`'s own step with gradients laid out as ``strategy``
    lays them out, on a one-rank communicator: the figure is the ``t_comp`` training reports, not
    a look-alike loop's. The layout matters: flat and bucketed gradients live in a buffer that is
    zeroed and accumulated into every step, about 0.5 ms for 7.5 MB that a loop which lets
    autograd hand over fresh gradients would not pay.
    """
    import torch

    from .comm.local import LocalComm
    from .config import TrainConfig
    from .data import Dataset
    from .gradsync import make
    from .trainer import Trainer, make_optimizer

    comm = LocalComm()
    cfg = TrainConfig(batch_size=batch, strategy=strategy, progress=False)
    data = Dataset(torch.randn(batch, in_features), torch.randint(0, classes, (batch,)), "random")
    sync = make(strategy, model, comm, cfg.bucket_mb)
    trainer = Trainer(model, make_optimizer(cfg, model), sync, data, comm, cfg)
    for _ in range(warmup + iterations):
        trainer._run_batch(data.x, data.y)
    params = sum(p.numel() for p in model.parameters())
    return StepTiming(statistics.median(trainer.t_comp[warmup:]), batch, params, name, torch.get_num_threads())


def calibrate(
    comm,
    sizes: Sequence[int] | None = None,
    layers: Sequence[int] = (784, 1024, 1024, 10),
    batch: int = 64,
    algorithm: str = "ring",
    strategy: str = "flat",
) -> Calibration:
    """Measure T_comp on every rank (the slowest sets the pace) and, at two or more ranks, α, β, γ.

    Collective: every rank must call it. At one rank only T_comp and γ are measured, and the
    network is left at zero cost; the caller decides what to do about that.
    """
    import torch

    from .launch import pin_threads

    pin_threads(comm.local_size)
    torch.manual_seed(0)
    model_name = "mlp " + "-".join(map(str, layers))
    step = measure_step(mlp(layers), batch, layers[0], layers[-1], name=model_name, strategy=strategy)
    slowest = max(comm.allgather_obj(step.seconds))
    step = StepTiming(slowest, step.batch, step.params, step.model, step.torch_threads)
    # Every rank must fit with the same γ to end with the same network; ranks reduce concurrently in
    # training too, so their mean is the figure that applies.
    gammas = comm.allgather_obj(measure_gamma())
    gamma = sum(gammas) / len(gammas)
    sweep: list[SweepPoint] = []
    network = Network(0.0, 0.0, gamma, "one rank: nothing measured")
    if comm.size > 1:
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


# -- running it -----------------------------------------------------------------------------------
def run_calibration(
    save: str | os.PathLike | None = None,
    max_bytes: int = 16 << 20,
    layers: Sequence[int] = (784, 1024, 1024, 10),
    batch: int = 64,
    algorithm: str = "ring",
    need_network: bool = True,
    spawn_ranks: int = 2,
    strategy: str = "flat",
) -> Calibration | None:
    """Calibrate from wherever this is called; the root gets the result, other ranks ``None``.

    Under mpiexec every rank measures together. As one process that needs α and β, it starts
    ``mpiexec -n spawn_ranks python -m mpi_sgd.calibrate`` and reads back what that job saved;
    as one process that needs only T_comp (the network comes from elsewhere), it measures here.
    """
    from .launch import placement

    if placement().size == 1 and need_network:
        import tempfile

        from .launch import run_job

        out = Path(save) if save else Path(tempfile.mkdtemp()) / "calibration.json"
        flags = ["--max-bytes", str(max_bytes), "--layers", ",".join(map(str, layers)), "--batch", str(batch),
                 "--strategy", strategy]  # fmt: skip
        run_job(spawn_ranks, "-m", "mpi_sgd.calibrate", "--save", str(out), *flags, "--algorithm", algorithm)
        return Calibration.load(out)
    from .comm import init

    comm = init("mpi4py")
    cal = calibrate(comm, sweep_sizes(max_bytes=max_bytes), layers, batch, algorithm, strategy)
    if not comm.is_root:
        return None
    if save:
        cal.save(save)
    return cal


def main(argv: Sequence[str] | None = None) -> int:
    """``mpiexec -n 2 python -m mpi_sgd.calibrate --save FILE``: measure, and the root saves."""
    from .args import ArgumentParser, nbytes, positive_int, positive_ints

    parser = ArgumentParser(prog="python -m mpi_sgd.calibrate", description=__doc__)
    parser.add_argument("--save", type=Path, required=True, help="JSON file to write (on the root rank)")
    parser.add_argument("--max-bytes", type=nbytes, default=16 << 20, help="largest all-reduce (default 16MiB)")
    parser.add_argument("--layers", type=positive_ints, default=[784, 1024, 1024, 10], help="MLP widths to time")
    parser.add_argument("--batch", type=positive_int, default=64, help="per-rank batch for T_comp (default 64)")
    parser.add_argument("--algorithm", choices=ALLREDUCE_ALGORITHMS, default="ring", help="cost formula to fit")
    parser.add_argument(
        "--strategy",
        choices=("naive", "flat", "bucketed"),
        default="flat",
        help="gradient layout T_comp is timed with, as sync_sgd's --strategy (default flat)",
    )
    args = parser.parse_args(argv)
    cal = run_calibration(args.save, args.max_bytes, args.layers, args.batch, args.algorithm, need_network=False,
                          strategy=args.strategy)  # fmt: skip
    if cal is not None:
        print(f"{cal.meta['ranks']} rank(s): T_comp {cal.step.seconds * 1e3:.3f} ms; {cal.network.describe()}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
