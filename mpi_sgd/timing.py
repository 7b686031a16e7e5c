"""Timing collectives honestly on a shared, noisy machine.

The recipe follows the OSU micro-benchmarks and nccl-tests: a barrier so every rank starts
together, warm-up iterations that are discarded (first calls pay for connection set-up and page
faults), the MPI clock (``MPI.Wtime``; on GPU the clock is read after ``torch.cuda.synchronize``),
and min/avg/max of the per-rank averages across ranks.

One addition for noisy machines: when several implementations are compared, their timed
iterations are split into ``rounds`` blocks and the blocks are interleaved (A B C A B C ...),
so a burst of load from elsewhere hits all of them alike, and the order rotates from round to
round. Each rank's figure is the median block, which a single disturbed block cannot move.

Timelines (the trainer's ``--timeline``, a pipeline's F/B boxes) are Chrome traces, viewable in
ui.perfetto.dev or chrome://tracing: each rank records its own events as ``(name, start,
seconds)`` or ``(name, start, seconds, args)`` with ``start`` read from ``time.perf_counter()``,
and :func:`chrome_trace` gathers them on the root as complete events (``"ph": "X"``), one lane
(``tid``) per rank, ``ts``/``dur`` in microseconds since ``t0``, the instant the ranks left a
common barrier (each rank passes its own reading).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from .comm import Communicator
from .gcpause import frozen_heap

# Steps or calls left out of every timing summary (the trainer's, calibration's, bench sgd's):
# the first ones pay for allocation, page faults and connection set-up.
WARMUP_STEPS = 5

# OSU defaults (osu_util.h): 1000 iterations and 100 warm-up below 8 KiB, 100 and 10 above.
OSU_LARGE_MESSAGE = 8192


def osu_iterations(nbytes: int) -> tuple[int, int]:
    """(iterations, warm-up) for a message of ``nbytes``, as OSU picks them."""
    return (1000, 100) if nbytes <= OSU_LARGE_MESSAGE else (100, 10)


def slowest_after_warmup(per_rank: Sequence[Sequence[float]], warmup: int = WARMUP_STEPS) -> list[float]:
    """Per step, the slowest rank's figure (it sets the pace of synchronous SGD), the first ``warmup``
    steps left out unless nothing else is left. ``per_rank[r][i]``: rank r's figure for step i."""
    slowest = [max(step) for step in zip(*per_rank, strict=True)]
    return slowest[warmup:] or slowest


@dataclass(frozen=True)
class Stat:
    """Seconds per call: min, avg and max over ranks of each rank's own figure; ``blocks``: per
    interleaved block, the slowest rank's (what a paired ratio with its interval is made of, see
    :mod:`mpi_sgd.confidence`)."""

    min: float
    avg: float
    max: float
    blocks: tuple = ()


def across_ranks(comm: Communicator, seconds: float, blocks: Sequence[float] = ()) -> Stat:
    values = comm.allgather_obj((seconds, list(blocks)))
    slowest = tuple(max(b) for b in zip(*(v[1] for v in values), strict=True)) if blocks else ()
    medians = [v[0] for v in values]
    return Stat(min(medians), sum(medians) / len(medians), max(medians), slowest)


def time_interleaved(
    comm: Communicator,
    calls: Mapping[str, Callable[[], object]],
    iterations: int,
    warmup: int,
    rounds: int = 5,
    sync: Callable[[], None] | None = None,
) -> dict[str, Stat]:
    """Seconds per call of each function in ``calls``, measured in interleaved blocks.

    ``sync`` runs before each clock reading (``torch.cuda.synchronize`` for GPU work).
    """
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    per_block = max(1, iterations // rounds)
    blocks: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    with frozen_heap():  # no block pays for a full collection of what the warm-up left alive
        for r in range(rounds):
            # Rotate who goes first: the block after a barrier, or after another implementation has
            # just churned the caches, is not the same for everyone, so no position is favoured.
            for name in names[r % len(names) :] + names[: r % len(names)]:
                fn = calls[name]
                comm.barrier()
                if sync:
                    sync()
                t0 = comm.wtime()
                for _ in range(per_block):
                    fn()
                if sync:
                    sync()
                blocks[name].append((comm.wtime() - t0) / per_block)
    return {name: across_ranks(comm, statistics.median(times), times) for name, times in blocks.items()}


def passes(names: Sequence[str], apart: Collection[str]) -> list[list[str]]:
    """The groups to time one after another: ``names`` interleaved, except those in ``apart``, which
    come after as a group of their own (empty groups left out). torch's gloo goes apart: timed
    interleaved with MPI all-reduces, its blocks (TCP through the kernel, its own threads) slowed
    the blocks between them, the shared all-reduce at 64 KiB from 15 to 39 us (bench shm)."""
    groups = [[n for n in names if n not in apart], [n for n in names if n in apart]]
    return [g for g in groups if g]


def chrome_trace(comm: Communicator, events, t0: float, counters=()) -> dict | None:
    """Every rank's ``events`` as one Chrome trace on the root; ``None`` on the other ranks.

    ``counters``, ``(name, time, {series: value})`` on the root, become counter tracks (``"ph": "C"``):
    values the job shares, such as the noise scale and learning rate per epoch."""
    mine = [(e[0], e[1] - t0, e[2], e[3] if len(e) > 3 else None) for e in events]
    everyone = comm.gather_obj(mine)
    if not comm.is_root:
        return None
    trace = []
    for rank, evs in enumerate(everyone):
        for name, start, seconds, args in evs:
            event = {"name": name, "ph": "X", "pid": 0, "tid": rank, "ts": 1e6 * start, "dur": 1e6 * seconds}
            if args:
                event["args"] = args
            trace.append(event)
    for name, when, values in counters:
        trace.append({"name": name, "ph": "C", "pid": 0, "ts": 1e6 * (when - t0), "args": values})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}
