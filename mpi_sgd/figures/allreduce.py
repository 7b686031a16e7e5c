"""All-reduce time and bus bandwidth against message size, one line per implementation.

From two benchmarks' JSON, one row of panels each, since they measure differently:
``mpi-sgd bench allreduce`` calls every implementation on the same buffer (a warm cache, as OSU
does) and ``mpi-sgd bench shm`` on a fresh slice of a large pool each call (a cold cache, as a
gradient bucket is after a training step), with one process's ``memcpy`` of the same bytes as
the floor. Each row is one interleaved run, so its lines compare side by side.

Bus bandwidth is nccl-tests' figure: the bytes each rank must send in a bandwidth-optimal
all-reduce of ``n`` bytes over ``p`` ranks, ``2(p-1)/p·n`` (the β term of
:func:`mpi_sgd.perfmodel.costs.ring_allreduce`, Patarasuk & Yuan's lower bound), per second of
the measured time, so it compares across world sizes. The memcpy floor becomes a ceiling there:
no all-reduce that reads and writes every byte once goes faster than copying them.
"""

from __future__ import annotations

from ..perfmodel.costs import ring_allreduce
from ..report import human_bytes, new_figure


def bus_bandwidth(nbytes: int, ranks: int, seconds: float) -> float:
    """GB/s on the bus: ``2(p-1)/p·n`` bytes per rank over ``seconds``; 0 at one rank (nothing moves)."""
    return ring_allreduce(nbytes, ranks).bandwidth / seconds / 1e9


def allreduce_series(result: dict) -> dict[str, tuple[list[int], list[float]]]:
    """``bench allreduce``'s JSON as {implementation: (bytes, seconds)}, the mean over ranks."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in sorted(result["rows"], key=lambda r: r["bytes"]):
        sizes, times = out.setdefault(row["impl"], ([], []))
        sizes.append(row["bytes"])
        times.append(row["avg_s"])
    return out


def shm_series(result: dict) -> dict[str, tuple[list[int], list[float]]]:
    """``bench shm``'s JSON as {implementation: (bytes, seconds)} (memcpy: the copying rank's)."""
    rows = sorted(result["rows"], key=lambda r: r["bytes"])
    # An implementation's time sits under its name; its blocks, bandwidth and wrong-result count
    # under the name with a suffix ("shared_blocks", "shared_busbw_GBps", "shared_wrong")
    impls = [k for k, v in rows[0].items() if k not in ("bytes", "ranks") and "_" not in k and isinstance(v, float)]
    return {impl: ([r["bytes"] for r in rows], [r[impl] for r in rows]) for impl in impls}


def _row(ax, bx, series: dict, ranks: int, title: str) -> None:
    for impl, (sizes, times) in series.items():
        floor = impl == "memcpy"
        style = dict(color="black", ls="--", marker=None) if floor else dict(marker="o", ms=3)
        label = "memcpy, one process" if floor else impl
        ax.loglog(sizes, [1e6 * t for t in times], label=label + (" (floor)" if floor else ""), **style)
        if ranks > 1:
            bw = [bus_bandwidth(n, ranks, t) for n, t in zip(sizes, times, strict=True)]
            bx.loglog(sizes, bw, label=label + (" (ceiling)" if floor else ""), **style)
    ax.set(xlabel="message size (bytes)", ylabel="time per call (us)", title=title)
    bx.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)", title=title)
    from matplotlib.ticker import FuncFormatter, LogLocator

    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.xaxis.set_major_locator(LogLocator(base=4))
        a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(int(v))))
        a.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    if bx.get_lines():
        bx.legend(fontsize=7)
    else:  # nothing crosses between ranks, so there is no bus bandwidth to speak of
        bx.text(0.5, 0.5, "one rank: nothing moves", ha="center", transform=bx.transAxes)


def draw(allreduce: dict | None, shm: dict | None):
    """One row of (time, bus bandwidth) panels per benchmark given."""
    runs = [
        (r, series, title)
        for r, series, title in (
            (allreduce, allreduce_series, "bench allreduce: the same buffer every call"),
            (shm, shm_series, "bench shm: a fresh buffer every call"),
        )
        if r is not None
    ]
    if not runs:
        raise ValueError("nothing to draw: give bench allreduce's or bench shm's JSON")
    fig, axes = new_figure(len(runs), 2, figsize=(11, 4 * len(runs)), squeeze=False)
    for (ax, bx), (result, series, title) in zip(axes, runs, strict=True):
        ranks = result["ranks"]
        _row(ax, bx, series(result), ranks, f"{title}, {ranks} ranks")
    fig.suptitle("all-reduce of float32, in place: time and bus bandwidth 2(p-1)/p·n / t", fontsize=11)
    fig.tight_layout()
    return fig
