"""bench sgd's report: its table, its plot, and its verdicts, from the rows :mod:`.sgd` measured.

A row is one variant of one model: ``model``, ``variant`` (the label, with the bucket size when
sizes are swept), ``name`` and ``bucket_mb`` (the variant and its bucket size apart), the slowest
rank's ``step_s`` and the spreads beside it (see :func:`mpi_sgd.bench.sgd.bench_model`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from ..confidence import median_interval, paired_ratio, target_line
from ..report import markdown_table, new_figure

SHARED_TARGET = 1.10  # a step with shared buckets at most this much slower than one with no communication
HEADERS = [
    "model",
    "variant",
    "step ms",
    "± std",
    "comm ms",
    "± std",
    "comm frac",
    "x DDP-gloo",
    "x local",
    "exposed ms",
]
# ddp-mpi4py: exposed communication vs ddp-gloo's (the project sets some models a target of their
# own), step vs bucketed's
EXPOSED_TARGET, STEP_TARGET = 0.35, 1.1
EXPOSED_TARGETS = {"simplenet": 0.25}


def spread(samples) -> dict:
    """Mean and standard deviation of per-step figures ([DDP-bench]'s avg/std columns)."""
    a = np.asarray(samples, dtype=float)
    if a.size == 0 or np.isnan(a).all():
        return {"avg": float("nan"), "std": float("nan")}
    return {"avg": float(a.mean()), "std": float(a.std(ddof=1)) if a.size > 1 else 0.0}


def add_ratios(rows, not_steps: Collection[str] = ()) -> list[dict]:
    """Each row's step over ddp-gloo's and over local's, and ``exposed_s``, its step minus local's: the
    communication it did not hide (the one measure every variant shares). NaN where the run lacks one,
    and for ``not_steps`` (comm-only times an all-reduce, not a step: nothing of it is hidden)."""
    ref = {r["variant"]: r["step_s"] for r in rows}
    for r in rows:
        r["vs_ddp"] = r["step_s"] / ref["ddp-gloo"] if "ddp-gloo" in ref else float("nan")
        r["vs_local"] = r["step_s"] / ref["local"] if "local" in ref else float("nan")
        step = "local" in ref and r["variant"] not in not_steps
        r["exposed_s"] = r["step_s"] - ref["local"] if step else float("nan")
    return rows


def verdicts(rows, comm, shared: Collection[str]) -> list[str]:
    """The shared-bucket target, per model: the best step of a variant named in ``shared`` (buckets
    in node-shared memory) within SHARED_TARGET of the local one."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = {r["variant"]: r["step_s"] for r in rows if r["model"] == model}
        candidates = [r["variant"] for r in rows if r["model"] == model and r["name"] in shared]
        if "local" not in mine or not candidates or comm.size < 2 or not comm.node_shared:
            continue
        best = min(candidates, key=mine.get)
        blocks = {r["variant"]: _blocks(r) for r in rows if r["model"] == model}
        interval = paired_ratio(blocks[best], blocks["local"])
        out.append(target_line(f"{model}: {best} step vs local (shared buckets)", interval, SHARED_TARGET))
    return out


def _blocks(row) -> list[float]:
    """A row's per-block step times (its median alone for rows from before blocks were kept)."""
    return row.get("step_blocks") or [row["step_s"]]


def watchdog_costs(rows, watched: Mapping[str, str]) -> list[str]:
    """'simplenet: bucketed / bucketed-no-watchdog = 1.004x per step' for each model (and bucket size):
    each variant in ``watched`` (run without the stall watchdog) beside the one it names, its twin
    with the watchdog, at the same bucket size."""
    out = []
    for bare in rows:
        twin = watched.get(bare["name"])
        r = next(
            (r for r in rows if (r["model"], r["name"], r["bucket_mb"]) == (bare["model"], twin, bare["bucket_mb"])),
            None,
        )
        if r is not None:
            out.append(
                f"{r['model']}: {r['variant']} / {bare['variant']} = {r['step_s'] / bare['step_s']:.3f}x per step"
            )
    return out


NOISE_TARGET = 1.02  # measuring the noise scale: at most 2% on the bucketed step


def targets(rows) -> list[str]:
    """ddp-mpi4py against its two targets, and the noise scale's cost, per model, where the run has what they need."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        row = {r["variant"]: r for r in rows if r["model"] == model}
        blocks = {v: _blocks(r) for v, r in row.items()}
        if {"bucketed", "noise-scale"} <= row.keys():
            cost = paired_ratio(blocks["noise-scale"], blocks["bucketed"])
            lines.append(target_line(f"{model}: bucketed step measuring the noise scale vs plain", cost, NOISE_TARGET))
        if not {"local", "bucketed", "ddp-gloo", "ddp-mpi4py"} <= row.keys():
            continue
        ours, gloo, local = blocks["ddp-mpi4py"], blocks["ddp-gloo"], blocks["local"]
        paired = len({len(ours), len(gloo), len(local)}) == 1
        shares = [(o - h) / (g - h) for o, g, h in zip(ours, gloo, local, strict=True) if g > h] if paired else []
        if shares:  # exposed communication, block by block: what each step adds over the local one
            exposed = median_interval(shares)
            lines.append(
                target_line(
                    f"{model}: ddp-mpi4py exposed communication vs ddp-gloo's",
                    exposed,
                    EXPOSED_TARGETS.get(model, EXPOSED_TARGET),
                )
            )
        step = paired_ratio(ours, blocks["bucketed"])
        lines.append(target_line(f"{model}: ddp-mpi4py step vs bucketed", step, STEP_TARGET))
    return lines


def breakdown(rows) -> list[str]:
    """``bucketed``'s step split by subtraction of variants timed in the same interleaved run: the
    compute (``local``, which takes the non-finite check's sums too, as a floor must), the strategy's
    own work with nothing to wait for (``bucketed-alone`` less ``local``: hooks, bucket copies,
    scaling), waiting for the slower rank where ``local-synced`` gives it, the all-reduce of every
    gradient on its own (``comm-only``), and the rest: polling (and, without ``local-synced``,
    waiting for each other), less whatever overlap hid (negative when it hid more).
    With ``unchecked`` in the run, a last line says what the check adds to the communicating step.
    Empty unless the rows of one model have ``local``, ``bucketed``, ``bucketed-alone`` and ``comm-only``."""
    ms = {r["variant"]: 1e3 * r["step_s"] for r in rows}
    if not {"local", "bucketed", "bucketed-alone", "comm-only"} <= ms.keys():
        return []
    straggle = ms["local-synced"] - ms["local"] if "local-synced" in ms else None
    rest = ms["bucketed"] - ms["bucketed-alone"] - ms["comm-only"] - (straggle or 0.0)
    parts = [
        ("compute: forward, backward, check's sums, update (local)", ms["local"]),
        ("hooks, bucket copies, scaling (bucketed-alone - local)", ms["bucketed-alone"] - ms["local"]),
        *([("waiting for the slower rank (local-synced - local)", straggle)] if straggle is not None else []),
        ("all-reduce of every gradient, alone (comm-only)", ms["comm-only"]),
        ("polling and waiting" + ("" if straggle is not None else " for ranks") + ", less overlap (the rest)", rest),
        ("bucketed step", ms["bucketed"]),
    ]
    if "unchecked" in ms:
        parts.append(("(the non-finite check's share of it: bucketed - unchecked)", ms["bucketed"] - ms["unchecked"]))
    return [f"  {what:<64} {v:8.3f}  {v / ms['local']:6.3f}x local" for what, v in parts]


def table(rows) -> str:
    return markdown_table(
        HEADERS,
        [
            [
                r["model"],
                r["variant"],
                1e3 * r["step_s"],
                1e3 * r["step_std_s"],
                1e3 * r["comm_s"],
                1e3 * r["comm_std_s"],
                r["comm_frac"],
                r["vs_ddp"],
                r["vs_local"],
                1e3 * r["exposed_s"],
            ]
            for r in rows
        ],
    )


def plot(rows, path) -> None:
    """Step time per variant, the part blocked in communication stacked at the bottom."""
    fig, axes = new_figure(1, len({r["model"] for r in rows}), figsize=(11, 4), squeeze=False)
    for ax, model in zip(axes[0], dict.fromkeys(r["model"] for r in rows), strict=False):
        mine = [r for r in rows if r["model"] == model and r["variant"] != "comm-only"]
        names = [r["variant"] for r in mine]
        step = [1e3 * r["step_s"] for r in mine]
        comm = [0.0 if r["comm_s"] != r["comm_s"] else 1e3 * r["comm_s"] for r in mine]
        ax.bar(names, step, color="tab:blue", label="step")
        ax.bar(names, comm, color="tab:orange", label="blocked in communication")
        ax.set_title(model)
        ax.set_ylabel("ms per step")
        ax.tick_params(axis="x", rotation=45)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
