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

from ..pipeline import ideal_bubble, simulate
from ..report import new_figure

COLOURS = {"F": "tab:blue", "B": "tab:orange"}
NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}


Box = tuple[int, str, int, float, float]  # stage, "F" or "B", micro-batch, start ms, ms


def traced_boxes(trace: dict) -> list[Box]:
    """A bench pipeline trace as boxes, in ms from its first op."""
    events = trace["traceEvents"]
    t0 = min(e["ts"] for e in events)
    return [(e["tid"], e["name"][0], e["args"]["micro_batch"], (e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in events]


def replayed_boxes(schedule: str, per_op_s: list[list[float]], m: int) -> list[Box]:
    """``schedule`` on the ideal machine of :func:`mpi_sgd.pipeline.simulate` (free messages, a core
    per stage) with each stage's measured (F, B) seconds per op."""
    ops = simulate(schedule, len(per_op_s), m, [f for f, _ in per_op_s], [b for _, b in per_op_s])
    return [(s, op.kind, op.mb, 1e3 * a, 1e3 * (b - a)) for s, stage in enumerate(ops) for op, a, b in stage]


def boxes_bubble(boxes: list[Box]) -> tuple[float, int, int]:
    """(bubble, stages, micro-batches): idle stage-time between the first op's start and the last's end."""
    stages = len({b[0] for b in boxes})
    span = max(b[3] + b[4] for b in boxes) - min(b[3] for b in boxes)
    busy = sum(b[4] for b in boxes)
    return 1 - busy / (stages * span), stages, len({b[2] for b in boxes})


def trace_bubble(trace: dict) -> tuple[float, int, int]:
    """(bubble, stages, micro-batches) of one traced step."""
    return boxes_bubble(traced_boxes(trace))


def _lanes(ax, boxes: list[Box], heading: str) -> None:
    bubble, R, m = boxes_bubble(boxes)
    for stage, kind, mb, start, width in boxes:
        ax.broken_barh([(start, width)], (stage - 0.4, 0.8), facecolors=COLOURS[kind], edgecolors="black", lw=0.4)
        ax.text(start + width / 2, stage, f"{kind}{mb}", ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_yticks(range(R), [f"stage {s}" for s in range(R)], fontsize=8)
    ax.set_ylim(R - 0.5, -0.5)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(f"{heading}: bubble {bubble:.2f} (formula {ideal_bubble(R, m):.2f})", fontsize=9)


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
    """Each schedule's traced step, and below it the same schedule replayed with the run's median
    F and B times per stage, one lane per stage; the bubble against m on the right."""
    panels = []
    for name, trace in traces.items():
        traced = traced_boxes(trace)
        R, m_traced = boxes_bubble(traced)[1:]
        title = f"{NAMES.get(name, name)}, R = {R}, m = {m_traced}"
        panels.append((traced, f"{title}, as it ran"))
        row = next((r for r in result["rows"] if r["schedule"] == name and r["m"] == m_traced), None)
        if row is not None:  # the bench measured this m: replay its median ops
            replay = replayed_boxes(name, row["per_op_s"], m_traced)
            panels.append((replay, f"{title}, replayed: the run's median F and B per stage, free messages"))
    n = len(panels)
    fig, axes = new_figure(n, 2, figsize=(13, 1.2 + 1.45 * n), squeeze=False, gridspec_kw={"width_ratios": (2.2, 1)})
    for ax, (boxes, heading) in zip(axes[:, 0], panels, strict=True):
        _lanes(ax, boxes, heading)
    axes[n - 1, 0].set_xlabel("ms from the step's first op", fontsize=8)
    for ax in axes[:, 1]:  # the right column becomes one panel spanning every row
        ax.remove()
    _bubbles(fig.add_subplot(axes[0, 0].get_gridspec()[:, 1]), result)
    fig.suptitle(
        "pipeline schedules: F = forward, B = backward of micro-batch i; bubble = idle stage-time", fontsize=11
    )
    fig.tight_layout()
    return fig
