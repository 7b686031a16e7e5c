"""The validation's comparison: predicted against measured step time, with verdicts.

Pure arithmetic over what :mod:`mpi_sgd.bench.validate` calibrated and measured: one
:class:`Row` per configuration and world size from each repeat, :class:`Spread` (median and
extremes) over the repeats, the two targets' verdicts, the markdown table and the plot.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..report import markdown_table, new_figure
from ..timing import slowest_after_warmup

TARGETED = (1, 2)  # world sizes the accuracy target applies to; larger ones oversubscribe here
TOLERANCE = 0.10
HEADERS = (
    "config",
    "R",
    "pred step (ms)",
    "meas step (ms)",
    "error %",
    "pred T_sync/T_comp",
    "pred speedup",
    "meas speedup",
    "pred pays?",
    "meas pays?",
)


@dataclass(frozen=True)
class Row:
    """One configuration at one R: the model's inputs, its prediction and the measurement."""

    batch: int
    ranks: int
    t_comp: float  # calibrated, R ranks stepping at once
    t_sync: float  # predicted all-reduce of the gradients
    measured: float  # seconds per step
    pred_speedup: float
    meas_speedup: float

    def __post_init__(self):
        if self.batch < 1 or self.ranks < 1 or not (self.t_comp > 0 and self.t_sync >= 0 and self.measured > 0):
            raise ValueError(f"not a validation row: {self}")

    @property
    def t_step(self) -> float:
        return self.t_comp + self.t_sync

    @property
    def error(self) -> float:
        """(predicted − measured) / measured: positive when the model is pessimistic."""
        return self.t_step / self.measured - 1

    @property
    def pred_pays(self) -> bool:
        return self.ranks > 1 and self.pred_speedup > 1

    @property
    def meas_pays(self) -> bool:
        return self.ranks > 1 and self.meas_speedup > 1


def assemble(batch: int, t_comp: Mapping[int, float], sync: Callable[[int], float], measured: Mapping[int, float]):
    """Rows for every R in ``measured``; R = 1 must be there, since both speedups are against it."""
    if 1 not in measured or 1 not in t_comp:
        raise ValueError("speedup is relative to one rank: R = 1 must be calibrated and measured")
    pred_1 = t_comp[1] + sync(1)
    return [
        Row(
            batch, r, t_comp[r], sync(r), measured[r], r * pred_1 / (t_comp[r] + sync(r)), r * measured[1] / measured[r]
        )
        for r in sorted(measured)
    ]


@dataclass(frozen=True)
class Spread:
    """One configuration at one R over the repeats: (min, median, max) of each figure."""

    batch: int
    ranks: int
    t_step: tuple[float, float, float]  # predicted
    measured: tuple[float, float, float]
    error: tuple[float, float, float]  # its ends pair the extremes: min pred / max meas − 1, ...
    ratio: float  # predicted T_sync/T_comp, median
    pred_speedup: tuple[float, float, float]
    meas_speedup: tuple[float, float, float]

    @property
    def pred_pays(self) -> bool | None:  # None: the spread straddles break-even
        return _side(self.ranks, self.pred_speedup)

    @property
    def meas_pays(self) -> bool | None:
        return _side(self.ranks, self.meas_speedup)


def _side(ranks: int, speedup: tuple[float, float, float]) -> bool | None:
    if ranks == 1:
        return False
    return True if speedup[0] > 1 else False if speedup[2] <= 1 else None


def _range(values: Sequence[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def summarize(repeats: Sequence[Sequence[Row]]) -> list[Spread]:
    """Rows of several repeats of the same configurations, one :class:`Spread` per (B, R)."""
    groups: dict[tuple[int, int], list[Row]] = {}
    for row in (r for rows in repeats for r in rows):
        groups.setdefault((row.batch, row.ranks), []).append(row)
    out = []
    for (batch, ranks), rows in groups.items():
        pred, meas = _range([r.t_step for r in rows]), _range([r.measured for r in rows])
        error = (pred[0] / meas[2] - 1, pred[1] / meas[1] - 1, pred[2] / meas[0] - 1)
        out.append(
            Spread(
                batch,
                ranks,
                pred,
                meas,
                error,
                statistics.median(r.t_sync / r.t_comp for r in rows),
                _range([r.pred_speedup for r in rows]),
                _range([r.meas_speedup for r in rows]),
            )
        )
    return out


def verdicts(
    rows: Sequence[Row] | Sequence[Spread], tolerance: float = TOLERANCE, targeted: Sequence[int] = TARGETED
) -> list[str]:
    """One line per target, 'met', 'MISSED' or 'inconclusive' (the spread straddles the line);
    untargeted R are named, not judged. Rows of one run are a spread of one."""
    spreads = [r if isinstance(r, Spread) else summarize([[r]])[0] for r in rows]
    aimed = [r for r in spreads if r.ranks in targeted]
    outside = [r for r in aimed if r.error[0] > tolerance or r.error[2] < -tolerance]  # the whole spread
    inside = [r for r in aimed if -tolerance <= r.error[0] and r.error[2] <= tolerance]
    off = [f"B={r.batch} R={r.ranks} {100 * r.error[1]:+.1f}%" for r in outside]
    unsure = [
        f"B={r.batch} R={r.ranks} {100 * r.error[0]:+.1f}..{100 * r.error[2]:+.1f}%"
        for r in aimed
        if r not in outside and r not in inside
    ]
    target = f"|error| <= {100 * tolerance:.0f}% at R = {', '.join(map(str, targeted))}"
    if off:
        lines = [f"MISSED: {target} (outside: {'; '.join(off)})"]
    elif unsure:
        lines = [f"inconclusive: {target} (the spread crosses the line: {'; '.join(unsure)})"]
    else:
        lines = [f"met: {target}"]
    multi = [r for r in aimed if r.ranks > 1]
    wrong = [
        f"B={r.batch} R={r.ranks}"
        for r in multi
        if None not in (r.pred_pays, r.meas_pays) and r.pred_pays != r.meas_pays
    ]
    unclear = [f"B={r.batch} R={r.ranks}" for r in multi if None in (r.pred_pays, r.meas_pays)]
    sides = {r.pred_pays for r in multi} - {None}
    if wrong:
        lines.append(f"MISSED: speedup < 1 exactly where predicted (wrong side beyond the spread: {'; '.join(wrong)})")
    elif unclear:
        lines.append(f"inconclusive: speedup < 1 exactly where predicted (spread straddles 1: {'; '.join(unclear)})")
    elif len(sides) < 2:
        side = "paying" if sides == {True} else "losing"
        lines.append(f"MISSED: a configuration on each side of break-even (all predicted on the {side} side)")
    else:
        lines.append("met: speedup < 1 exactly where predicted, with configurations on both sides")
    rest = [r for r in spreads if r.ranks not in targeted]
    if rest:
        worst = max(rest, key=lambda r: abs(r.error[1]))
        agree = sum(r.pred_pays == r.meas_pays and r.pred_pays is not None for r in rest)
        lines.append(
            f"reported, not targeted: R = {', '.join(sorted({str(r.ranks) for r in rest}))} "
            f"(worst error B={worst.batch} R={worst.ranks} {100 * worst.error[1]:+.1f}%; "
            f"pays? agrees in {agree} of {len(rest)})"
        )
    return lines


def table(rows: Sequence[Row] | Sequence[Spread]) -> str:
    """Each figure as median (min-max) over the repeats; a single run prints plain values."""
    spreads = [r if isinstance(r, Spread) else summarize([[r]])[0] for r in rows]

    def cell(v: tuple[float, float, float], scale: float, fmt: str) -> str:
        lo, mid, hi = (format(scale * x, fmt) for x in v)
        return mid if lo == hi else f"{mid} ({lo}..{hi})"

    def yes(flag: bool | None, r: Spread) -> str:
        return "baseline" if r.ranks == 1 else {True: "yes", False: "no", None: "?"}[flag]

    body = [
        (
            f"B={r.batch}",
            r.ranks,
            cell(r.t_step, 1e3, ".2f"),
            cell(r.measured, 1e3, ".2f"),
            cell(r.error, 100, "+.1f"),
            f"{r.ratio:.3f}",
            cell(r.pred_speedup, 1, ".2f"),
            cell(r.meas_speedup, 1, ".2f"),
            yes(r.pred_pays, r),
            yes(r.meas_pays, r),
        )
        for r in spreads
    ]
    # Two tables of the same rows, step times then speedups: with spreads over repeats, all ten
    # columns side by side would be twice a terminal's 120 columns.
    split = HEADERS.index("pred T_sync/T_comp")
    times = markdown_table(HEADERS[:split], [row[:split] for row in body])
    return times + "\n\n" + markdown_table(HEADERS[:2] + HEADERS[split:], [row[:2] + row[split:] for row in body])


def step_seconds(metrics: dict) -> tuple[float, float]:
    """(median, mean) over the steps after warm-up of the slowest rank's t_comp + t_sync."""
    per_rank = [
        [c + s for c, s in zip(comp, sync, strict=True)]
        for comp, sync in zip(metrics["t_comp"], metrics["t_sync"], strict=True)
    ]
    kept = slowest_after_warmup(per_rank, metrics["warmup_steps"])
    return statistics.median(kept), statistics.fmean(kept)


def plot(rows: Sequence[Spread], path: Path) -> None:
    fig, (ax, bx) = new_figure(1, 2, figsize=(10, 4))

    def draw(axis, scale, values, style, **kw):  # median, with the spread over the repeats as bars
        mid = [scale * v[1] for v in values]
        bars = [
            [m - scale * v[0] for m, v in zip(mid, values, strict=True)],
            [scale * v[2] - m for m, v in zip(mid, values, strict=True)],
        ]
        return axis.errorbar(ranks, mid, yerr=bars, fmt=style, capsize=3, **kw)[0]

    for b in sorted({r.batch for r in rows}):
        mine = [r for r in rows if r.batch == b]
        ranks = [r.ranks for r in mine]
        line = draw(ax, 1e3, [r.t_step for r in mine], "o--", label=f"B={b} predicted")
        draw(ax, 1e3, [r.measured for r in mine], "s-", color=line.get_color(), label=f"B={b} measured")
        draw(bx, 1, [r.pred_speedup for r in mine], "o--", color=line.get_color(), label=f"B={b} predicted")
        draw(bx, 1, [r.meas_speedup for r in mine], "s-", color=line.get_color(), label=f"B={b} measured")
    ax.set(xlabel="ranks R", ylabel="step time (ms)", yscale="log", title="sync_sgd step, flat all-reduce")
    bx.axhline(1.0, color="red", lw=1, label="break-even")
    bx.set(xlabel="ranks R", ylabel="speedup over 1 rank", title="weak scaling")
    for a in (ax, bx):
        a.set_xticks(sorted({r.ranks for r in rows}))
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
