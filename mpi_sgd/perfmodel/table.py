"""The speedup table and plot: what the speedup calculator prints and draws."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from .scaling import ScalingPoint

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
    from ..report import new_figure  # matplotlib, imported only when a plot is asked for

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


def plot_target(points, path, title: str = "", measured: dict | None = None):
    """Speedup against R, per epoch ([S-SGD]) and to the target (the noise-scale model), as a PNG;
    ``measured`` ({R: speedup to the target}) adds the measured points."""
    from ..report import new_figure

    ranks = [p.ranks for p in points]
    fig, ax = new_figure(figsize=(6, 4))
    ax.plot(ranks, ranks, "--", color="grey", label="ideal")
    ax.axhline(1.0, color="red", lw=1, label="break-even")
    ax.plot(ranks, [p.speedup_epoch for p in points], "o-", label="per epoch ([S-SGD]'s law)")
    ax.plot(ranks, [p.speedup_target for p in points], "s-", label="to the target (noise-scale model)")
    if measured:
        ax.plot(list(measured), list(measured.values()), "k*", ms=10, label="measured to the target")
    ax.set_xlabel("ranks R")
    ax.set_ylabel("speedup over 1 rank")
    ax.set_title(textwrap.fill(title, 80), fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.clf()
    return path
