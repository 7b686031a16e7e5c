"""ZeRO's model-state memory per rank, stage by stage: measured beside the formula.

From ``mpi-sgd bench zero``'s JSON: for plain data parallel (stage 0) and ZeRO stages 1-3, the
bytes of parameters, gradients and optimizer state one rank held at the optimizer step, measured
on the tensors, as a stacked bar; beside it, hatched, what Rajbhandari et al.'s formulas give
(:func:`mpi_sgd.perfmodel.memory.model_states`, fp32: 4 B parameters, 4 B gradients, 8 B Adam
or 4 B momentum state per parameter; each sharded state divided by R). The marker is the peak
during the step, transient buffers included, which the formulas leave out.
"""

from __future__ import annotations

from ..perfmodel import memory as memmodel
from ..report import new_figure

KINDS = (("params", "parameters", "tab:blue"), ("grads", "gradients", "tab:orange"))
KINDS += (("optimizer", "optimizer state", "tab:green"),)
VARIANTS = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
MIB = 2**20


def bars(result: dict, optimizer: str) -> list[tuple[str, int, dict, dict, float]]:
    """(variant, stage, measured MiB by kind, formula MiB by kind, peak MiB) for each stage measured."""
    R, psi = result["world_size"], result["psi"]
    out = []
    for variant, stage in VARIANTS.items():
        if variant not in result["memory"]:
            continue
        at_step, peak = result["memory"][variant]
        want = memmodel.model_states(psi, stage, R, optimizer, "fp32")
        formula = {"params": want.params, "grads": want.grads, "optimizer": want.optimizer}
        out.append(
            (
                variant,
                stage,
                {k: at_step[k] / MIB for k, _, _ in KINDS},
                {k: formula[k] / MIB for k, _, _ in KINDS},
                sum(peak.values()) / MIB,
            )
        )
    if not out:
        raise ValueError(f"no stage to draw: the result has {sorted(result['memory'])}, wanted one of {list(VARIANTS)}")
    return out


def draw(result: dict, optimizer: str = "adam"):
    """Two stacked bars per stage, measured and formula, with the peak as a marker."""
    from matplotlib.patches import Patch

    rows = bars(result, "momentum" if optimizer == "sgd" else optimizer)
    fig, ax = new_figure(figsize=(8, 4.6))
    width = 0.38
    for i, (_, _, measured, formula, peak) in enumerate(rows):
        for offset, values, hatch in ((-width / 2, measured, None), (width / 2, formula, "//")):
            bottom = 0.0
            for key, name, colour in KINDS:
                ax.bar(
                    i + offset,
                    values[key],
                    width,
                    bottom=bottom,
                    color=colour,
                    alpha=0.55 if hatch else 1.0,
                    hatch=hatch,
                    edgecolor="black",
                    linewidth=0.5,
                    label=(name if hatch is None else None) if i == 0 else None,
                )
                bottom += values[key]
            ax.text(i + offset, bottom, f"{bottom:.0f}", ha="center", va="bottom", fontsize=7)
        ax.plot(
            i - width / 2, peak, "_", color="tab:red", ms=26, mew=2.5, label="peak during the step" if i == 0 else None
        )
    handles, _ = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="formula (hatched)"))
    names = {0: "data parallel", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
    ax.set_xticks(range(len(rows)), [f"{names[s]}\nmeasured | formula" for _, s, _, _, _ in rows], fontsize=8)
    ax.set_ylabel("MiB per rank")
    R, psi = result["world_size"], result["psi"]
    ax.set_title(
        f"model states per rank at R = {R}: {psi / 1e6:.1f} M parameters, fp32, {optimizer}\n"
        "stage 1 shards the optimizer state, 2 also the gradients, 3 also the parameters",
        fontsize=9,
    )
    ax.legend(handles=handles, fontsize=7, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
