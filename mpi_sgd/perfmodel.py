"""When does synchronous data-parallel SGD pay? A first-order model, in seconds and bytes.

**Epoch time ([S-SGD]).** With ``N`` samples, a per-rank batch ``B`` and ``R`` replicas, every
step processes ``R·B`` samples, so an epoch is ``N/(R·B)`` steps of ``T_comp + T_sync``::

    T_epoch(R) = N/(R·B) · (T_comp + T_sync(R)),      T_sync(1) = 0

where ``T_comp`` is one rank's forward + backward + optimizer step on its ``B`` samples and
``T_sync`` the gradient all-reduce on the critical path. Against one process
(``T_epoch(1) = N/B · T_comp``)::

    speedup(R)    = R · T_comp / (T_comp + T_sync)
    efficiency(R) = speedup / R = T_comp / (T_comp + T_sync)

and distribution pays (speedup > 1) exactly when ``T_sync / T_comp < R − 1``. Equality is the
break-even line: with ``T_comp = T_sync = 1 s`` a step of two ranks takes 2 s for 2·B samples,
just what one rank takes for them (speedup 1.00); three ranks take 2 s for 3·B (speedup 1.50). The
model takes [S-SGD]'s continuous step count ``N/(R·B)`` (a loader runs ``⌈N/(R·B)⌉``), so the
speedup does not depend on ``N``, and ``T_sync`` at R = 1 is zero: one process sends nothing.

This is **weak scaling** in the per-step sense (fixed per-rank batch, global batch ``R·B``
grows). **Strong scaling** keeps the global batch ``B`` fixed, so each rank computes ``B/R``
samples for ``N/B`` steps; :class:`Compute` assumes step time is linear in the batch,
``T_comp(b) = t_fixed + (T_comp − t_fixed)·b/B``, ``t_fixed`` being the part no batch size
shrinks (the optimizer step, Python overhead).

**Communication.** Hockney's α-β model (1994) with γ for the reduction, as Thakur et al. (2005)
use it: sending ``n`` bytes costs ``α + n·β``, combining ``n`` bytes costs ``n·γ``. Each
algorithm below is a triple of coefficients ``(a, b, c)`` with cost ``a·α + b·β + c·γ``, so the
same formulas serve prediction (:meth:`Network.time`) and calibration by least squares
(:mod:`mpi_sgd.calibrate`).

Everything here is plain arithmetic: no MPI, no torch. Measured per-step seconds (a trainer's
compute and communication time) plug straight into :class:`Compute` and :class:`FixedSync`.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

SCALINGS = ("weak", "strong")
ALLREDUCE_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner")


def _check_time(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def _check_count(name: str, value: int, minimum: int = 1) -> None:
    if not (isinstance(value, int) and value >= minimum):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_inputs(t_comp: float, t_sync: float, ranks: int) -> None:
    _check_time("t_comp", t_comp)
    _check_time("t_sync", t_sync)
    _check_count("ranks", ranks)
    if t_comp == 0:
        raise ValueError("t_comp must be positive: a step that costs nothing cannot be sped up")


# -- [S-SGD]: epoch time, speedup, break-even ---------------------------------------------
def speedup(t_comp: float, t_sync: float, ranks: int) -> float:
    """R·T_comp / (T_comp + T_sync): [S-SGD]'s law at a fixed per-rank batch (1 at R = 1)."""
    _check_inputs(t_comp, t_sync, ranks)
    if ranks == 1:
        return 1.0
    return ranks * t_comp / (t_comp + t_sync)


def pays(t_comp: float, t_sync: float, ranks: int) -> bool:
    """[S-SGD], inequality (3): T_sync/T_comp < R − 1, written without division so it is exact."""
    _check_inputs(t_comp, t_sync, ranks)
    return ranks > 1 and t_sync < (ranks - 1) * t_comp


def break_even_ranks(t_comp: float, t_sync: float) -> int:
    """Smallest R at which distribution pays: the first integer above 1 + T_sync/T_comp."""
    _check_inputs(t_comp, t_sync, 1)
    return math.floor(1 + t_sync / t_comp) + 1


@dataclass(frozen=True)
class Compute:
    """One rank's seconds per step (forward + backward + optimizer step) at per-rank batch ``batch``.

    Leave ``batch`` out when ``t_comp`` was measured at the batch the table is for (a trainer's
    own per-step figure): :func:`scaling` then takes it as that batch.
    """

    t_comp: float
    batch: int | None = None
    t_fixed: float = 0.0  # the part that does not shrink with the batch

    def __post_init__(self):
        _check_time("t_comp", self.t_comp)
        _check_time("t_fixed", self.t_fixed)
        if self.batch is not None:
            _check_count("batch", self.batch)
        if self.t_comp <= 0:
            raise ValueError("t_comp must be positive: a step that costs nothing cannot be sped up")
        if self.t_fixed > self.t_comp:
            raise ValueError(f"t_fixed ({self.t_fixed}) cannot exceed t_comp ({self.t_comp})")

    def at_batch(self, batch: float) -> float:
        """Seconds per step at another per-rank batch, linear in the batch."""
        if self.batch is None:
            raise ValueError("this Compute does not say which batch t_comp was measured at")
        return self.t_fixed + (self.t_comp - self.t_fixed) * batch / self.batch


@dataclass(frozen=True)
class FixedSync:
    """A measured or assumed T_sync, the same at every R > 1 ([S-SGD]'s reading)."""

    seconds: float

    def __post_init__(self):
        _check_time("t_sync", self.seconds)

    def __call__(self, ranks: int) -> float:
        return 0.0 if ranks == 1 else self.seconds

    def describe(self) -> str:
        return f"T_sync = {self.seconds:g} s at every R > 1"


@dataclass(frozen=True)
class AllreduceSync:
    """T_sync(R) as the α-β-γ cost of all-reducing ``nbytes`` of gradients with ``algorithm``."""

    network: Network
    nbytes: int
    algorithm: str = "ring"

    def __post_init__(self):
        _check_count("nbytes", self.nbytes, minimum=0)
        if self.algorithm not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose one of {', '.join(ALLREDUCE_ALGORITHMS)}")

    def __call__(self, ranks: int) -> float:
        return self.network.time(allreduce_coefficients(self.algorithm, self.nbytes, ranks))

    def describe(self) -> str:
        return f"{self.algorithm} all-reduce of {self.nbytes:,} bytes over {self.network.describe()}"


@dataclass(frozen=True)
class ScalingPoint:
    """One row of the speedup table."""

    ranks: int
    per_rank_batch: float
    steps: float  # per epoch, continuous as in [S-SGD]
    t_comp: float
    t_sync: float
    t_epoch: float
    speedup: float
    efficiency: float
    pays: bool

    @property
    def t_step(self) -> float:
        return self.t_comp + self.t_sync


def scaling(
    compute: Compute,
    sync: Callable[[int], float],
    ranks: Sequence[int],
    samples: int,
    batch: int,
    mode: str = "weak",
) -> list[ScalingPoint]:
    """T_epoch, speedup and efficiency at each R, against one process with the same model.

    ``batch`` is the per-rank batch for ``mode="weak"`` ([S-SGD]) and the global batch for
    ``mode="strong"``. Speedup is computed from per-step times and the step-count ratio, not
    from two rounded epoch times, so the break-even case comes out exactly 1.
    """
    if mode not in SCALINGS:
        raise ValueError(f"unknown scaling {mode!r}; choose one of {', '.join(SCALINGS)}")
    _check_count("samples", samples)
    _check_count("batch", batch)
    for r in ranks:
        _check_count("ranks", r)
        if mode == "strong" and r > batch:
            raise ValueError(f"strong scaling splits the global batch {batch} over {r} ranks: fewer than 1 each")
    if compute.batch is None:
        compute = replace(compute, batch=batch)
    t_step_1 = compute.at_batch(batch)
    points = []
    for r in ranks:
        per_rank = batch if mode == "weak" else batch / r
        t_comp, t_sync = compute.at_batch(per_rank), sync(r)
        t_step = t_comp + t_sync
        steps = samples / (r * batch) if mode == "weak" else samples / batch
        # What one rank alone needs for the samples of one R-rank step: R of its own steps (weak),
        # or the same single step at the full batch (strong). Speedup is that over t_step, and
        # "pays" compares the two directly, so the break-even case is exact, not 0.9999.
        alone = (r if mode == "weak" else 1) * t_step_1
        s = alone / t_step
        points.append(ScalingPoint(r, per_rank, steps, t_comp, t_sync, steps * t_step, s, s / r, t_step < alone))
    return points


# -- α-β-γ costs of collectives --------------------------------------------------------------
@dataclass(frozen=True)
class Coefficients:
    """Cost = latency·α + bandwidth·β + compute·γ: messages in sequence, bytes sent, bytes combined."""

    latency: float
    bandwidth: float
    compute: float = 0.0

    def __add__(self, other: Coefficients) -> Coefficients:
        return Coefficients(
            self.latency + other.latency, self.bandwidth + other.bandwidth, self.compute + other.compute
        )


@dataclass(frozen=True)
class Network:
    """α (s per message), β (s per byte sent), γ (s per byte reduced)."""

    alpha: float
    beta: float
    gamma: float = 0.0
    name: str = ""

    def __post_init__(self):
        for field in ("alpha", "beta", "gamma"):
            _check_time(field, getattr(self, field))

    @classmethod
    def from_link(cls, latency_s: float, bytes_per_s: float, gamma: float = 0.0, name: str = "") -> Network:
        if not bytes_per_s > 0:
            raise ValueError(f"bandwidth must be positive, got {bytes_per_s!r}")
        return cls(latency_s, 1.0 / bytes_per_s, gamma, name)

    def time(self, c: Coefficients) -> float:
        return c.latency * self.alpha + c.bandwidth * self.beta + c.compute * self.gamma

    def describe(self) -> str:
        def rate(per_byte: float) -> str:  # 1/beta and 1/gamma read better as GB/s
            return f"{1e-9 / per_byte:.3g} GB/s" if per_byte else "free"

        label = f"{self.name}: " if self.name else ""
        return f"{label}alpha {self.alpha * 1e6:.3g} us, 1/beta {rate(self.beta)}, 1/gamma {rate(self.gamma)}"


def _log2_floor(p: int) -> int:
    return p.bit_length() - 1


def _fold_to_power_of_two(n: float, p: int) -> tuple[int, Coefficients]:
    """MPICH's non-power-of-two trick (Thakur et al. 2005): fold the extra r = p − p' ranks in.

    Before: r ranks send their whole vector to a partner, which reduces it (α + nβ + nγ).
    After: the partners send the result back (α + nβ). Returns p' and those two extra steps.
    """
    p2 = 1 << _log2_floor(p)
    if p2 == p:
        return p, Coefficients(0, 0, 0)
    return p2, Coefficients(2, 2 * n, n)


def ring_allreduce(n: float, p: int) -> Coefficients:
    """Ring all-reduce: 2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ.

    A reduce-scatter then an allgather around the ring, p−1 steps each, every step moving n/p
    bytes (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations", JPDC 69(2), 2009). Its β term meets their lower bound, see
    :func:`allreduce_bandwidth_bound`; its α term grows linearly in p.
    """
    _check_count("p", p)
    if p == 1:
        return Coefficients(0, 0, 0)
    return Coefficients(2 * (p - 1), 2 * (p - 1) / p * n, (p - 1) / p * n)


def recursive_doubling_allreduce(n: float, p: int) -> Coefficients:
    """Recursive doubling: lg p·α + lg p·nβ + lg p·nγ for p a power of two.

    In step k each rank exchanges its whole vector with the rank 2^k away and reduces (Thakur,
    Rabenseifner & Gropp, "Optimization of Collective Communication Operations in MPICH",
    IJHPCA 19(1), 2005: MPICH's choice for short messages). Other p pay two extra steps,
    see :func:`_fold_to_power_of_two`.
    """
    _check_count("p", p)
    if p == 1:
        return Coefficients(0, 0, 0)
    p2, extra = _fold_to_power_of_two(n, p)
    lg = _log2_floor(p2)
    return Coefficients(lg, lg * n, lg * n) + extra


def rabenseifner_allreduce(n: float, p: int) -> Coefficients:
    """Rabenseifner: 2 lg p·α + 2(p−1)/p·nβ + (p−1)/p·nγ for p a power of two.

    A reduce-scatter by recursive halving then an allgather by recursive doubling (Thakur,
    Rabenseifner & Gropp 2005: MPICH's choice for long messages). Bandwidth-optimal like
    the ring, with only logarithmically many messages; other p pay two extra full-vector steps.
    """
    _check_count("p", p)
    if p == 1:
        return Coefficients(0, 0, 0)
    p2, extra = _fold_to_power_of_two(n, p)
    lg = _log2_floor(p2)
    return Coefficients(2 * lg, 2 * (p2 - 1) / p2 * n, (p2 - 1) / p2 * n) + extra


def binomial_broadcast(n: float, p: int) -> Coefficients:
    """Binomial-tree broadcast: ⌈lg p⌉·(α + nβ) (Thakur, Rabenseifner & Gropp 2005).

    The set of ranks holding the data doubles each step; no reduction, so no γ. This is what
    sending the initial weights from the root costs, once per run.
    """
    _check_count("p", p)
    steps = math.ceil(math.log2(p)) if p > 1 else 0
    return Coefficients(steps, steps * n, 0)


def allreduce_bandwidth_bound(n: float, p: int) -> Coefficients:
    """Lower bound on any all-reduce's β term: 2(p−1)/p·nβ (Patarasuk & Yuan 2009).

    Every rank must send out, and receive, at least (p−1)/p of its data for the reduction
    and again for the result. Ring and Rabenseifner meet it; recursive doubling does not.
    """
    _check_count("p", p)
    return Coefficients(0, 2 * (p - 1) / p * n, 0)


_ALLREDUCE = {
    "ring": ring_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "rabenseifner": rabenseifner_allreduce,
}


def allreduce_coefficients(algorithm: str, n: float, p: int) -> Coefficients:
    try:
        return _ALLREDUCE[algorithm](n, p)
    except KeyError:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALLREDUCE_ALGORITHMS)}") from None


# -- overlapping communication with the backward pass ----------------------------------------
@dataclass(frozen=True)
class StepBreakdown:
    """One step of a bucketed strategy: the wall time and how much communication it exposes."""

    t_step: float
    t_comp: float  # forward + backward + optimizer, as if nothing were sent

    @property
    def t_sync_exposed(self) -> float:
        """The T_sync that belongs in the epoch formula: communication not hidden by compute."""
        return self.t_step - self.t_comp


def overlapped_step(t_forward: float, buckets: Sequence[tuple[float, float]], t_optimizer: float) -> StepBreakdown:
    """Step time when bucket i's all-reduce overlaps the backward pass of later buckets.

    ``buckets`` lists ``(backward_s, allreduce_s)`` in the order the backward pass fills them
    (last layer first). Bucket i is ready when its backward part ends; its all-reduce starts
    then or when bucket i−1's finishes, whichever is later (one all-reduce at a time, in order,
    as every rank must issue them alike); the optimizer waits for the last one::

        ready_i = F + Σ_{j≤i} b_j,   end_i = max(ready_i, end_{i−1}) + c_i,   T = end_last + T_opt

    One bucket is the no-overlap case F + b + c + T_opt. It assumes communication proceeds
    without stealing compute; on CPU ranks that share cores with MPI progress it does not, so
    treat the overlap as a bound.
    """
    _check_time("t_forward", t_forward)
    _check_time("t_optimizer", t_optimizer)
    ready = end = t_forward
    backward = 0.0
    for b, c in buckets:
        _check_time("bucket backward", b)
        _check_time("bucket all-reduce", c)
        ready += b
        backward += b
        end = max(ready, end) + c
    end = max(end, ready)
    return StepBreakdown(end + t_optimizer, t_forward + backward + t_optimizer)


def bucketed_step(
    t_forward: float,
    t_backward: float,
    t_optimizer: float,
    grad_bytes: int,
    bucket_bytes: int,
    allreduce_time: Callable[[int], float],
) -> StepBreakdown:
    """:func:`overlapped_step` for gradients cut into equal buckets of ``bucket_bytes`` (last one smaller).

    Backward time is shared out in proportion to bucket bytes, a first approximation (layers
    differ in FLOPs per parameter). ``allreduce_time(nbytes)`` prices one bucket, e.g.
    ``lambda n: net.time(ring_allreduce(n, R))``.
    """
    _check_count("grad_bytes", grad_bytes)
    _check_count("bucket_bytes", bucket_bytes)
    full, rest = divmod(grad_bytes, bucket_bytes)
    sizes = [bucket_bytes] * full + ([rest] if rest else [])
    return overlapped_step(t_forward, [(t_backward * s / grad_bytes, allreduce_time(s)) for s in sizes], t_optimizer)


# -- presenting -------------------------------------------------------------------------------
TABLE_HEADERS = (
    "R",
    "batch/rank",
    "T_comp (s)",
    "T_sync (s)",
    "T_sync/T_comp",
    "T_epoch (s)",
    "speedup",
    "efficiency",
    "pays?",
)


def table_rows(points: Sequence[ScalingPoint]) -> list[tuple[str, ...]]:
    """Rows for :data:`TABLE_HEADERS`; "pays?" reads [S-SGD]'s test T_sync/T_comp < R − 1."""
    rows = []
    for p in points:
        verdict = "baseline" if p.ranks == 1 else ("yes" if p.pays else "no")
        rows.append(
            (
                str(p.ranks),
                f"{p.per_rank_batch:g}",
                f"{p.t_comp:.4g}",
                f"{p.t_sync:.4g}",
                f"{p.t_sync / p.t_comp:.3g}",
                f"{p.t_epoch:.4g}",
                f"{p.speedup:.2f}",
                f"{100 * p.efficiency:.0f}%",
                verdict,
            )
        )
    return rows


def plot_scaling(points: Sequence[ScalingPoint], path, title: str = ""):
    """Speedup against R with the ideal line and the break-even line, as a PNG."""
    from .bench.report import new_figure  # matplotlib, imported only when a plot is asked for

    ranks = [p.ranks for p in points]
    fig, ax = new_figure(figsize=(6, 4))
    ax.plot(ranks, ranks, "--", color="grey", label="ideal (T_sync = 0)")
    ax.axhline(1.0, color="red", lw=1, label="break-even")
    ax.plot(ranks, [p.speedup for p in points], "o-", label="model")
    ax.set_xlabel("ranks R")
    ax.set_ylabel("speedup over 1 rank")
    ax.set_title(textwrap.fill(title, 80), fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.clf()
    return path
