"""``bench shm``'s report: the tables, the project's targets with their verdicts, the plot.

The targets (:func:`speedup_targets`): the shared all-reduce against MPI's own ``Allreduce`` at
every size where the shared path runs, and against a one-process memcpy, the floor for an
all-reduce that reads and writes every byte once.
"""

from __future__ import annotations

from ..confidence import fit_line, paired_ratio, verdict
from ..report import human_bytes, markdown_table, plot_by_size

LARGE = 64 << 10  # the targets' boundary: at least MPI's speed from here up, and below it
NEAR_MEMCPY = 4 << 20  # from here up it must be within MEMCPY_FACTOR of a memcpy
MEMCPY_FACTOR = 1.3


def speedup_targets(ranks: int) -> list[tuple[float, int, int | None]]:
    """The project's factors over MPI's all-reduce, as ``(factor, from bytes, to bytes or None)``:
    at two ranks 1.5x from 128 KiB and 1.8x from 2 to 8 MiB, with more ranks on the node
    1.3x from 256 KiB; at every rank count never slower than MPI where the
    shared path runs."""
    if ranks <= 2:
        return [(1.0, LARGE, None), (1.5, 128 << 10, None), (1.8, 2 << 20, 8 << 20)]
    return [(1.0, LARGE, None), (1.3, 256 << 10, None)]


def verdicts(rows, ranks: int) -> list[str]:
    """One line per target, over every size it covers: each size's paired ratio with its 95%
    interval (:mod:`mpi_sgd.confidence`); "met" when every size's interval meets it, "not met" when
    some size's misses it whole, "inconclusive" otherwise; the line shows the worst size."""
    out = []
    if ranks < 2 or not rows or "shared" not in rows[0]:
        return out

    def line(name, a, b, target, at_most, sizes):
        chosen = [r for r in rows if sizes(r["bytes"])]
        if not chosen:
            return
        found = [(paired_ratio(_blocks(r, a), _blocks(r, b)), r["bytes"]) for r in chosen]
        said = [verdict(i, target, at_most) for i, _ in found]
        overall = "not met" if "not met" in said else "inconclusive" if "inconclusive" in said else "met"
        worst, at = (max if at_most else min)(found, key=lambda f: f[0].median)
        here = "" if overall == "met" else " here"
        said = f"project target {name}: {overall}{here}"
        why = f"({'highest' if at_most else 'lowest'} {worst.text(2)} at {human_bytes(at)})"
        out.append(fit_line(said, why))

    if "raw" in rows[0]:
        for want, lo, hi in speedup_targets(ranks):
            span = f"from {human_bytes(lo)}" if hi is None else f"from {human_bytes(lo)} to {human_bytes(hi)}"
            line(
                f">= {want:g}x MPI Allreduce {span}",
                "raw",
                "shared",
                want,
                False,
                lambda b, lo=lo, hi=hi: b >= lo and (hi is None or b <= hi),
            )
        line(
            f">= 1x MPI Allreduce below {human_bytes(LARGE)}",
            "raw",
            "shared",
            1.0,
            False,
            lambda b: b < LARGE,
        )
    if "memcpy" in rows[0]:
        line(
            f"within {MEMCPY_FACTOR:g}x of a one-process memcpy from {human_bytes(NEAR_MEMCPY)}",
            "shared",
            "memcpy",
            MEMCPY_FACTOR,
            True,
            lambda b: b >= NEAR_MEMCPY,
        )
    return out


def _blocks(row, impl) -> list[float]:
    """An implementation's per-block times at one size (its median alone in rows without blocks)."""
    return row.get(f"{impl}_blocks") or [row[impl]]


def table(rows, impls) -> str:
    """Microseconds per call, a column per implementation."""
    return markdown_table(
        ["size"] + list(impls), [[human_bytes(r["bytes"])] + [1e6 * r[i] for i in impls] for r in rows]
    )


def derived_table(rows, impls) -> str:
    """What the times say: ratios (raw/shared above 1: shared is faster), bus bandwidth and nccl-tests'
    count of wrong results (all implementations, each size)."""
    ratios = [(a, b) for a, b in (("raw", "shared"), ("seam", "shared"), ("gloo", "shared")) if {a, b} <= set(impls)]
    ratios += [("shared", "memcpy")] if {"shared", "memcpy"} <= set(impls) else []
    reducers = [i for i in impls if i != "memcpy"]
    base = next(iter(reducers), None)
    headers = ["size"] + [f"{a}/{b}" for a, b in ratios]
    headers += [f"busbw GB/s ({base})", "#wrong"] if base else []
    body = []
    for r in rows:
        line = [human_bytes(r["bytes"])] + [f"{r[a] / r[b]:.2f}" for a, b in ratios]
        if base:
            line += [r[f"{base}_busbw_GBps"], str(sum(r.get(f"{i}_wrong", 0) for i in reducers))]
        body.append(line)
    return markdown_table(headers, body)


def plot(rows, impls, path) -> None:
    sizes = [r["bytes"] for r in rows]
    series = {impl: (sizes, [1e6 * r[impl] for r in rows]) for impl in impls}
    plot_by_size(path, series, "time per call (us)", f"all-reduce on fresh buffers, {rows[0]['ranks']} ranks")
