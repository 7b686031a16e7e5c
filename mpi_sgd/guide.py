"""Which parallelism fits: memory per rank and time per step of each strategy, to first order.

Plain arithmetic, no MPI and no torch, on top of :mod:`mpi_sgd.perfmodel`'s α-β-γ network
model. For P parameters of 4 bytes (float32), R ranks, and an optimizer keeping K tensors of
state per parameter (plain SGD 0, momentum 1, Adam 2), the **model state** one rank holds
(parameters, gradients, optimizer state; activations come on top and are the user's to add):

=================  ==============================  =================================================
strategy           model state per rank            communication per step, per rank
=================  ==============================  =================================================
data parallel      (8 + 4K)·P                      all-reduce of 4P: 2(R-1)α + 2(R-1)/R·4P·β
ZeRO-1             8P + 4K·P/R                     the same volume (reduce-scatter + all-gather)
ZeRO-2             4P + (4 + 4K)·P/R               the same volume
ZeRO-3             (8 + 4K)·P/R                    1.5x: parameters all-gathered again for backward
pipeline, S = R    (8 + 4K)·P/R                    activations at stage boundaries only
parameter server   worker 8P; server (4 + 4K +     per gradient 4P out and 4P back through k servers
 (k servers)        8W)·P/k (a buffer pair per
                    worker W = R - k)
=================  ==============================  =================================================

ZeRO after Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (SC 2020), in float32 here (their 16P with mixed-precision Adam is 4P + 4P + 8P in these
terms). Pipeline after Huang et al., "GPipe" (NeurIPS 2019): with M micro-batches over S stages
a fraction (S - 1)/(M + S - 1) of every step is idle (the bubble). Parameter server after Li et
al., "Scaling Distributed Machine Learning with the Parameter Server" (OSDI 2014); the server
state counts this project's implementation (:mod:`mpi_sgd.paramserver`), which keeps one receive
and one reply buffer per worker.

**Time per gradient** (T_comp: one rank's forward + backward at its batch):

* synchronous data parallel: R gradients per T_comp + T_sync; a straggler ``slowdown`` times
  slower sets the pace of everyone (T_comp·slowdown + T_sync);
* parameter server: each worker turns out one gradient per T_comp + its push and pull
  (2kα + 8Pβ; the slowest at T_comp·slowdown), and the k servers together can take at most one
  gradient per 2α + 8P/k·β + 4P/k·γ: throughput is the smaller of the two; staleness costs
  statistical efficiency on top (tau about W - 1), which a time model does not see;
* ZeRO-3 and pipeline: see :func:`estimate`.

**To accuracy.** Given the gradient noise scale ``b_noise`` and the per-rank ``batch``, the
data-parallel strategies (plain and ZeRO, whose global batch is R·batch) count each gradient at
its worth towards a target: R·batch samples need S(R·batch) = S_min(1 + B_noise/(R·batch)) steps
where one rank needs S(batch) (:mod:`mpi_sgd.perfmodel.goodput`), so R gradients per step buy
S(batch)/S(R·batch) one-rank steps, not R. The pipeline and the parameter server keep each
gradient's batch, so their rates stand (staleness aside).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .perfmodel import Network, ring_allreduce, steps_to_target

OPTIMIZER_STATE = {"sgd": 0, "momentum": 1, "adam": 2}  # tensors of state per parameter
STRATEGIES = ("data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3", "pipeline", "parameter server")


@dataclass(frozen=True)
class Problem:
    """What the user knows: model size, memory, network, cluster and (optionally) compute time."""

    params: int
    memory: float  # bytes available per rank for model state
    network: Network
    ranks: int
    optimizer: str = "momentum"
    t_comp: float | None = None  # seconds of forward + backward per batch on one rank
    slowdown: float = 1.0  # the slowest rank's T_comp over the others' (1: all alike)
    servers: int = 1  # for the parameter server
    micro_batches: int = 8  # for the pipeline
    boundary_bytes: float = 0.0  # activation bytes a pipeline stage sends on per batch (and back)
    b_noise: float | None = None  # the gradient noise scale: data parallelism counted to accuracy
    batch: int = 32  # per-rank batch, with b_noise

    def __post_init__(self):
        if self.params < 1 or self.ranks < 1 or self.memory <= 0:
            raise ValueError("params and ranks must be at least 1 and memory positive")
        if self.optimizer not in OPTIMIZER_STATE:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZER_STATE)}")
        if self.t_comp is not None and not (self.t_comp > 0 and math.isfinite(self.t_comp)):
            raise ValueError(f"t_comp must be a positive number of seconds, got {self.t_comp!r}")
        if self.b_noise is not None and not (self.b_noise >= 0 and math.isfinite(self.b_noise)) or self.batch < 1:
            raise ValueError("b_noise must be a finite number >= 0 and batch at least 1")
        if self.slowdown < 1 or self.servers < 1 or self.micro_batches < 1 or self.boundary_bytes < 0:
            raise ValueError("slowdown >= 1, servers >= 1, micro_batches >= 1, boundary_bytes >= 0")


@dataclass(frozen=True)
class Estimate:
    strategy: str
    memory: float  # bytes of model state on the fullest rank
    fits: bool
    bytes_per_step: float  # sent by one rank per step (parameter server: per gradient, by a worker)
    gradients_per_s: float | None  # None: no T_comp given, or the strategy cannot run at this R
    note: str = ""


def model_state(strategy: str, p: Problem) -> float:
    """Bytes of parameters, gradients and optimizer state on the fullest rank."""
    P, R, K = p.params, p.ranks, OPTIMIZER_STATE[p.optimizer]
    if strategy == "data parallel":
        return (8 + 4 * K) * P
    if strategy == "ZeRO-1":
        return 8 * P + 4 * K * P / R
    if strategy == "ZeRO-2":
        return 4 * P + (4 + 4 * K) * P / R
    if strategy in ("ZeRO-3", "pipeline"):
        return (8 + 4 * K) * P / R
    if strategy == "parameter server":
        workers = max(1, R - p.servers)
        return max(8 * P, (4 + 4 * K + 8 * workers) * P / p.servers)
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def estimate(strategy: str, p: Problem) -> Estimate:
    P, R, net = p.params, p.ranks, p.network
    mem = model_state(strategy, p)
    allreduce = net.time(ring_allreduce(4 * P, R))
    sent = 2 * (R - 1) / R * 4 * P
    rate, note = None, ""
    slow = p.t_comp * p.slowdown if p.t_comp else None
    if strategy in ("data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3"):
        factor = 1.5 if strategy == "ZeRO-3" else 1.0
        if slow:
            rate = R / (slow + factor * allreduce)
        sent *= factor
        if strategy == "ZeRO-3":
            note = "parameters gathered again for backward"
        if rate and p.b_noise is not None:  # R gradients per step are worth S(B)/S(R·B) one-rank steps
            worth = steps_to_target(p.batch, 1, p.b_noise) / (R * steps_to_target(R * p.batch, 1, p.b_noise))
            rate *= worth
            note = "; ".join(filter(None, [note, f"each gradient {worth:.2f} of its worth to accuracy"]))
    elif strategy == "pipeline":
        S, M = R, p.micro_batches
        sent = 2 * p.boundary_bytes if R > 1 else 0.0
        note = f"bubble {(S - 1) / (M + S - 1):.0%} at {M} micro-batches"
        if R > 1 and not p.boundary_bytes:
            note += "; untimed without the activation bytes at a stage boundary"
        elif slow:
            hop = net.alpha + p.boundary_bytes / M * net.beta if R > 1 else 0.0
            # one batch of M micro-batches: M + S - 1 slots of (a stage's share + one hop each way)
            rate = 1 / ((M + S - 1) * (slow / (S * M) + 2 * hop))
    elif strategy == "parameter server":
        k, workers = p.servers, R - p.servers
        sent = 4 * P
        if workers < 1:
            return Estimate(strategy, mem, mem <= p.memory, sent, None, f"needs R > {k} (servers and a worker)")
        if p.t_comp:
            worker = (workers - 1) / (p.t_comp + 2 * k * net.alpha + 8 * P * net.beta)
            worker += 1 / (slow + 2 * k * net.alpha + 8 * P * net.beta)
            server = 1 / (2 * net.alpha + 8 * P / k * net.beta + 4 * P / k * net.gamma)
            rate = min(worker, server)
            note = "server-bound" if server < worker else f"{workers} workers, stale by about {workers - 1}"
    else:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return Estimate(strategy, mem, mem <= p.memory, sent, rate, note)


def recommend(p: Problem) -> tuple[str, list[Estimate], str]:
    """The strategy to use, every estimate, and why, in one sentence.

    The rules: the simplest strategy whose model state fits (in the order of :data:`STRATEGIES`);
    another that fits only when the model says it is more than 10% faster (first-order estimates
    are not finer than that).
    """
    estimates = [estimate(s, p) for s in STRATEGIES]
    fitting = [e for e in estimates if e.fits and e.gradients_per_s != 0]
    if not fitting:
        smallest = min(estimates, key=lambda e: e.memory)
        return (
            "none",
            estimates,
            (
                f"nothing fits: even {smallest.strategy} needs {smallest.memory / 2**30:.2f} GiB "
                f"per rank; add ranks or memory, or shrink the model"
            ),
        )
    choice = fitting[0]
    why = f"{choice.strategy} is the simplest whose model state fits ({choice.memory / 2**30:.2f} GiB per rank)"
    timed = [e for e in fitting if e.gradients_per_s]
    if choice.gradients_per_s and timed:
        best = max(timed, key=lambda e: e.gradients_per_s)
        if best is not choice and best.gradients_per_s > 1.1 * choice.gradients_per_s:
            why += f"; {best.strategy} is predicted {best.gradients_per_s / choice.gradients_per_s:.2f}x faster"
            choice = best
    if p.t_comp and p.ranks > 1:
        alone = 1 / p.t_comp
        if choice.gradients_per_s and choice.gradients_per_s <= alone and model_state("data parallel", p) <= p.memory:
            why += f"; but one rank alone ({alone:.3g} gradients/s) is as fast: distribution does not pay here"
    return choice.strategy, estimates, why
