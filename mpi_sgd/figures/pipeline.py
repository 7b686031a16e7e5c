"""GPipe and 1F1B as they ran: one traced step of each, and the bubble beside its formula.

From ``mpi-sgd bench pipeline``'s output: its Chrome traces (``pipeline-timeline-<schedule>-n<R>
.json``, one step at ``m = --timeline-m``, one lane per stage, ``F<i>``/``B<i>`` events with the
micro-batch in ``args``) and its JSON (``pipeline-n<R>.json``, the bubble at every m measured).

A step's bubble is the share of stage-time spent not computing: ``1 - Σ(F and B seconds) / (R ·
span)``. GPipe's formula for R equal stages and free messages is ``(R-1)/(m+R-1)``
(:func:`mpi_sgd.pipeline.ideal_bubble`); the benchmark's "replayed" bubble runs the schedule on an
idealised machine with each stage's measured F and B times, so the gap between it and the
formula is unequal stages, and the gap between it and the measured bubble is messages and the
host (ranks sharing cores wait for one).
"""

from __future__ import annotations

from ..pipeline import ideal_bubble
from ..report import new_figure

COLOURS = {"F": "tab:blue", "B": "tab:orange"}
NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}


def trace_bubble(trace: dict) -> tuple[float, int, int]:
    """(bubble, stages, micro-batches) of one traced step."""
    events = trace["traceEvents"]
    stages = len({e["tid"] for e in events})
    start = min(e["ts"] for e in events)
    span = max(e["ts"] + e["dur"] for e in events) - start
    busy = sum(e["dur"] for e in events)
    m = len({e["args"]["micro_batch"] for e in events})
    return 1 - busy / (stages * span), stages, m


def _lanes(ax, trace: dict, name: str) -> None:
    events = trace["traceEvents"]
    t0 = min(e["ts"] for e in events)
    bubble, R, m = trace_bubble(trace)
    for e in events:
        kind, mb = e["name"][0], e["args"]["micro_batch"]
        start, width = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
        ax.broken_barh([(start, width)], (e["tid"] - 0.4, 0.8), facecolors=COLOURS[kind], edgecolors="black", lw=0.4)
        ax.text(start + width / 2, e["tid"], f"{kind}{mb}", ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_yticks(range(R), [f"stage {s}" for s in range(R)], fontsize=8)
    ax.set_ylim(R - 0.5, -0.5)
    ax.set_xlabel("ms from the step's first op", fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    formula = ideal_bubble(R, m)
    heading = f"{NAMES.get(name, name)}, R = {R}, m = {m}: bubble {bubble:.2f} measured, {formula:.2f} by (R-1)/(m+R-1)"
    ax.set_title(heading, fontsize=9)


def _bubbles(ax, result: dict) -> None:
    R = result["world_size"]
    ms = sorted({r["m"] for r in result["rows"]})
    fine = [m / 4 for m in range(4, 4 * max(ms) + 1)]
    ax.plot(fine, [ideal_bubble(R, m) for m in fine], "k--", label="(R-1)/(m+R-1)")
    for schedule, marker in zip(dict.fromkeys(r["schedule"] for r in result["rows"]), "os^", strict=False):
        mine = sorted((r["m"], r["bubble"], r["replayed_bubble"]) for r in result["rows"] if r["schedule"] == schedule)
        name = NAMES.get(schedule, schedule)
        line = ax.plot([m for m, _, _ in mine], [b for _, b, _ in mine], marker + "-", label=f"{name} measured")[0]
        ax.plot(
            [m for m, _, _ in mine],
            [r for _, _, r in mine],
            marker,
            mfc="none",
            color=line.get_color(),
            label=f"{name} replayed (ideal machine, measured F/B)",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_ylim(0, 1)
    ax.set(xlabel="micro-batches m", ylabel="bubble fraction", title=f"bubble against m, R = {R}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def draw(result: dict, traces: dict[str, dict]):
    """Each schedule's traced step on the left, one lane per stage; the bubble against m on the right."""
    n = len(traces)
    fig, axes = new_figure(n, 2, figsize=(13, 2.4 + 1.6 * n), squeeze=False, gridspec_kw={"width_ratios": (2.2, 1)})
    for ax, (name, trace) in zip(axes[:, 0], traces.items(), strict=True):
        _lanes(ax, trace, name)
    for ax in axes[:, 1]:  # the right column becomes one panel spanning every row
        ax.remove()
    _bubbles(fig.add_subplot(axes[0, 0].get_gridspec()[:, 1]), result)
    fig.suptitle("pipeline schedules as they ran: F = forward, B = backward of micro-batch i", fontsize=11)
    fig.tight_layout()
    return fig
