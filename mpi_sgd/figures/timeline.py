"""One training step of every rank, from the trainer's Chrome trace (``--timeline``).

The trace (:func:`mpi_sgd.timing.chrome_trace`) holds every step of a run: on each rank (``tid``)
``forward``, ``backward``, one ``allreduce[i]`` per gradient bucket and ``optimizer``, with
``ts``/``dur`` in microseconds from a common barrier. A step on a rank runs from the end of its
previous ``optimizer`` event to the end of its own; a bucket's all-reduce belongs to the step in
which it started (during that step's backward, when it overlaps).

:func:`pick_step` takes a typical step: of those after the warm-up, the one whose span (first
start to last end over all ranks) is the median. :func:`draw` puts it on one lane per rank, the
compute on top and each bucket's all-reduce on a row of its own below it, and reports how much of
the all-reduce time ran while backward was still computing: what bucketing buys.
"""

from __future__ import annotations

import statistics

from ..report import new_figure

COMPUTE = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}
ALLREDUCE = "tab:purple"


def steps_by_rank(trace: dict) -> dict[int, list[list[dict]]]:
    """Each rank's events cut into steps at the end of each ``optimizer`` event."""
    by_rank: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        by_rank.setdefault(e["tid"], []).append(e)
    out = {}
    for rank, events in sorted(by_rank.items()):
        events.sort(key=lambda e: e["ts"])
        ends = [e["ts"] + e["dur"] for e in events if e["name"] == "optimizer"]
        steps, begin = [], float("-inf")
        for end in ends:
            steps.append([e for e in events if begin <= e["ts"] < end])
            begin = end
        out[rank] = steps
    return out


def _span(events: list[dict]) -> tuple[float, float]:
    return min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events)


def pick_step(steps: dict[int, list[list[dict]]], warmup: int) -> int:
    """The median-span step among those after ``warmup`` (all of them when there are no more)."""
    count = min(len(s) for s in steps.values())
    if count == 0:
        raise ValueError("the trace has no complete step (no 'optimizer' event on some rank)")
    candidates = list(range(warmup, count)) or list(range(count))
    spans = {
        i: max(_span(s[i])[1] for s in steps.values()) - min(_span(s[i])[0] for s in steps.values()) for i in candidates
    }
    middle = statistics.median_low(spans.values())
    return min(i for i, v in spans.items() if v == middle)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(events: list[dict]) -> tuple[float, float]:
    """(microseconds some all-reduce was in flight, of them while backward was computing)."""
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("allreduce")])
    back = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "backward"]
    hidden = sum(max(0.0, min(b, d) - max(a, c)) for a, b in busy for c, d in back)
    return sum(b - a for a, b in busy), hidden


def draw(trace: dict, warmup: int, title: str = ""):
    """The typical step (:func:`pick_step`) of ``trace``, one lane per rank; times from its start."""
    steps = steps_by_rank(trace)
    k = pick_step(steps, warmup)
    step = {rank: s[k] for rank, s in steps.items()}
    t0 = min(_span(events)[0] for events in step.values())
    buckets = sorted({e["name"] for ev in step.values() for e in ev if e["name"].startswith("allreduce")})
    rows = 1 + len(buckets)  # compute, then one row per bucket
    fig, ax = new_figure(figsize=(10, 1.2 + 0.42 * rows * len(step)))
    yticks, ylabels, shown = [], [], set()
    notes = []
    for lane, (rank, events) in enumerate(sorted(step.items())):
        top = lane * (rows + 0.8)
        yticks.append(top + 0.4)
        ylabels.append(f"rank {rank}")
        for e in events:
            start, width = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            if e["name"] in COMPUTE:
                y, colour, label = top, COMPUTE[e["name"]], e["name"]
            else:
                y, colour, label = top + 1 + buckets.index(e["name"]), ALLREDUCE, "bucket all-reduce"
            ax.broken_barh(
                [(start, width)],
                (y, 0.8),
                facecolors=colour,
                edgecolors="black",
                linewidth=0.4,
                label=None if label in shown else label,
            )
            shown.add(label)
            if e["name"] not in COMPUTE:
                number = e["name"][len("allreduce") :].strip("[]")
                ax.text(start + width, y + 0.4, f" bucket {number}", va="center", fontsize=7)
        flight, hidden = overlap(events)
        notes.append(f"rank {rank}: {hidden / max(flight, 1e-9):.0%} of all-reduce time under backward")
    ax.set_yticks(yticks, ylabels)
    ax.set_ylim(len(step) * (rows + 0.8) - 0.6, -0.4)
    count = min(len(s) for s in steps.values())
    ax.set_xlabel(f"ms from the start of step {k + 1} of {count} (the median-length one after {warmup} warm-up)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize=8, frameon=False)
    heading = title or f"one bucketed training step, {len(step)} ranks, {len(buckets)} buckets"
    ax.set_title(heading + "\n" + "; ".join(notes), fontsize=9)
    fig.tight_layout()
    return fig, k
