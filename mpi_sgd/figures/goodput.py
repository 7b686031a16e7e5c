"""Time to a target: steps against the global batch (measured, the rule, the fitted model) beside
time to the target against R, predicted and measured, from ``mpi-sgd bench goodput``'s JSON."""

from __future__ import annotations

from ..perfmodel import steps_to_target


def draw(result: dict):
    """Steps against the global batch (measured, the rule, the fit) beside time to the target against R."""
    from ..report import new_figure

    fig, (a, b) = new_figure(1, 2, figsize=(11, 4))
    rows = result["rows"]
    batches = [r["batch"] for r in rows]
    a.plot([r["batch"] for r in rows if r["steps"]], [r["steps"] for r in rows if r["steps"]], "o", label="tuned")
    a.plot([r["batch"] for r in rows if r["rule_steps"]], [r["rule_steps"] for r in rows if r["rule_steps"]], "x")
    a.lines[-1].set_label(f"{result['rule']} rule")
    if result["fit"]:
        s_min, b_noise = result["fit"]["s_min"], result["fit"]["b_noise"]
        a.plot(batches, [steps_to_target(x, s_min, b_noise) for x in batches], "-", label="S_min(1 + B_noise/B)")
        a.axvline(b_noise, color="grey", ls=":", label=f"B_noise {b_noise:.3g}")
    if any(r["steps"] or r["rule_steps"] for r in rows):  # a run where every batch missed has nothing to scale
        a.set(xscale="log", yscale="log")
    a.set(xlabel="global batch", ylabel="steps to the target", title="steps against batch")
    a.legend(fontsize=8)
    for transport in sorted({j["transport"] for j in result.get("jobs", [])}):
        mine = [j for j in result["jobs"] if j["transport"] == transport and "seconds_predicted" in j]
        b.plot([j["ranks"] for j in mine], [j["seconds_predicted"] for j in mine], "-", label=f"{transport}: model")
        got = [j for j in mine if j["seconds"] is not None]
        b.plot([j["ranks"] for j in got], [j["seconds"] for j in got], "o", label=f"{transport}: measured")
    b.set(xlabel="ranks R", ylabel="seconds to the target", title="time to the target against R")
    if b.lines:  # no jobs without a fit
        b.legend(fontsize=8)
    fig.tight_layout()
    return fig
