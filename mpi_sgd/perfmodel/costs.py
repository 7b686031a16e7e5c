"""α-β-γ costs of collectives: what an all-reduce of n bytes over p ranks takes.

Hockney's α-β model (1994) with γ for the reduction, as Thakur et al. (2005) use it: sending
``n`` bytes costs ``α + n·β``, combining ``n`` bytes costs ``n·γ``. Each algorithm below is a
triple of coefficients ``(a, b, c)`` with cost ``a·α + b·β + c·γ``, so the same formulas serve
prediction (:meth:`Network.time`) and calibration by least squares (:mod:`mpi_sgd.calibrate`).
:class:`AllreduceSync` turns them into a T_sync(R) for :func:`~mpi_sgd.perfmodel.scaling.scaling`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .scaling import check_count, check_time

ALLREDUCE_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner")


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
            check_time(field, getattr(self, field))

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
    workstations", JPDC 69(2), 2009). Its β term meets their lower bound for any all-reduce,
    2(p−1)/p·nβ: every rank must send out (p−1)/p of its data for the reduction and again for
    the result. Its α term grows linearly in p.
    """
    check_count("p", p)
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
    check_count("p", p)
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
    check_count("p", p)
    if p == 1:
        return Coefficients(0, 0, 0)
    p2, extra = _fold_to_power_of_two(n, p)
    lg = _log2_floor(p2)
    return Coefficients(2 * lg, 2 * (p2 - 1) / p2 * n, (p2 - 1) / p2 * n) + extra


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


@dataclass(frozen=True)
class AllreduceSync:
    """T_sync(R) as the α-β-γ cost of all-reducing ``nbytes`` of gradients with ``algorithm``."""

    network: Network
    nbytes: int
    algorithm: str = "ring"

    def __post_init__(self):
        check_count("nbytes", self.nbytes, minimum=0)
        if self.algorithm not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose one of {', '.join(ALLREDUCE_ALGORITHMS)}")

    def __call__(self, ranks: int) -> float:
        return self.network.time(allreduce_coefficients(self.algorithm, self.nbytes, ranks))

    def describe(self) -> str:
        return f"{self.algorithm} all-reduce of {self.nbytes:,} bytes over {self.network.describe()}"


# What-if networks: link rate from the standard, latency and achievable share of the link as
# typically reported by OSU micro-benchmarks (MPI over TCP or verbs) and nccl-tests (NVLink).
# Order-of-magnitude figures for comparing options, not a substitute for a calibration.
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
