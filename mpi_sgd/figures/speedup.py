"""Speedup against R: the T_sync/T_comp model beside measured training.

From ``mpi-sgd bench validate``'s JSON. For each per-rank batch B it holds the network the
calibration fitted (α, β, γ from an all-reduce sweep at R = 2), the gradient bytes, each R's
calibrated T_comp and, per R run, the predicted and the measured speedup (median and spread over
the repeats). Drawn for each B, weak scaling, [S-SGD]'s ``speedup(R) = R·T_comp / (T_comp +
T_sync(R))`` (:func:`mpi_sgd.perfmodel.scaling`):

* the line: the model for separate nodes, T_comp(R) = T_comp(1) and T_sync(R) the ring all-reduce
  of the gradients over the fitted network, out to R = 16;
* hollow markers: the model with T_comp(R) as calibrated with R ranks sharing this host, which
  is what the validation predicts;
* filled markers with bars: measured, median and spread over the repeats.

Distribution pays above the break-even line, speedup 1 (T_sync/T_comp < R - 1).
"""

from __future__ import annotations

from .. import perfmodel as pm
from ..report import new_figure

MAX_RANKS = 16


def model_curve(result: dict, batch: int, ranks=None) -> list[pm.ScalingPoint]:
    """The separate-nodes model for ``batch`` from the first repeat's calibration."""
    run = result["runs"][f"B={batch}"][0]
    network = pm.Network(**run["network"])
    t_comp = next(r["t_comp"] for r in result["repeats"][0] if r["batch"] == batch and r["ranks"] == 1)
    ranks = ranks or [r for r in range(1, MAX_RANKS + 1)]
    sync = pm.AllreduceSync(network, run["grad_bytes"], "ring")
    return pm.scaling(pm.Compute(t_comp, batch), sync, ranks, samples=batch * MAX_RANKS, batch=batch)


def draw(result: dict):
    """Speedup against R for every batch of the validation: model line, predictions, measurements."""
    from matplotlib.ticker import FuncFormatter

    fig, ax = new_figure(figsize=(7.5, 5))
    batches = sorted({r["batch"] for r in result["rows"]})
    top = bottom = 1.0
    for b in batches:
        curve = model_curve(result, b)
        line = ax.plot(
            [p.ranks for p in curve], [p.speedup for p in curve], "-", label=f"B={b}: model, separate nodes"
        )[0]
        colour = line.get_color()
        rows = sorted((r for r in result["rows"] if r["batch"] == b), key=lambda r: r["ranks"])
        ranks = [r["ranks"] for r in rows]
        ax.plot(
            ranks,
            [r["pred_speedup"] for r in rows],
            "o",
            mfc="none",
            color=colour,
            label=f"B={b}: model, T_comp(R) calibrated here",
        )
        mid = [r["meas_speedup"] for r in rows]
        lo = [m - r["spread"]["meas_speedup"][0] for m, r in zip(mid, rows, strict=True)]
        hi = [r["spread"]["meas_speedup"][2] - m for m, r in zip(mid, rows, strict=True)]
        ax.errorbar(ranks, mid, yerr=[lo, hi], fmt="s", color=colour, capsize=3, label=f"B={b}: measured")
        shown = [*mid, *(r["pred_speedup"] for r in rows), *(p.speedup for p in curve)]
        top, bottom = max(top, *shown), min(bottom, *shown)
    ax.plot([1, MAX_RANKS], [1, MAX_RANKS], ":", color="grey", label="ideal, T_sync = 0")
    ax.axhline(1.0, color="tab:red", lw=1, label="break-even")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ticks = [2**i for i in range(MAX_RANKS.bit_length())]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_ylim(bottom / 1.5, 1.5 * top)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set(xlabel="ranks R", ylabel="speedup over one rank (weak scaling)")
    net = result["runs"][f"B={batches[0]}"][0]
    ax.set_title(
        f"speedup = R·T_comp / (T_comp + T_sync(R)); ring all-reduce of {net['grad_bytes'] / 1e6:.1f} MB over\n"
        f"the network calibrated here ({pm.Network(**net['network']).describe()}), transport {result['transport']}",
        fontsize=8,
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    verdicts = result.get("verdicts", [])
    fig.tight_layout(rect=(0, 0.025 * len(verdicts), 1, 1))
    if verdicts:  # the validation's own judgement of these numbers, as it printed it
        fig.text(0.01, 0.005, "bench validate: " + "\n".join(verdicts), fontsize=6.5, va="bottom", wrap=True)
    return fig
