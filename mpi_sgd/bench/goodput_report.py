"""``bench goodput``'s comparison: the fit, predicted beside measured, the project's targets and the plot."""

from __future__ import annotations

import math
from pathlib import Path

from ..perfmodel import AllreduceSync, Network, fit, steps_to_target
from ..report import markdown_table

STEPS_TOLERANCE, KNEE_FACTOR, TIME_TOLERANCE, SPAN = 0.35, 2.0, 0.30, 16  # the targets


def knee(rows: list[dict]) -> float | None:
    """Where the measured steps fall to twice their minimum (the model's S(B_noise) = 2·S_min),
    interpolated in log batch; None if they never were that high."""
    pts = [(r["batch"], r["steps"]) for r in rows if r["steps"] is not None]
    if not pts:
        return None
    floor = min(s for _, s in pts)
    for (b0, s0), (b1, s1) in zip(pts, pts[1:], strict=False):
        if s0 >= 2 * floor >= s1:
            f = (s0 - 2 * floor) / (s0 - s1) if s0 != s1 else 0.0
            return math.exp(math.log(b0) + f * (math.log(b1) - math.log(b0)))
    return None


def training_seconds(record: dict) -> float | None:
    """A job's seconds to the target, scoring the held-out set left out; None if it missed."""
    return record["wall_s"] - record.get("eval_s", 0.0) if record["reached"] else None


def assemble(args, rows: list[dict], noise: dict, runs: list[dict], cores: int) -> dict:
    result = {"batch": args.batch, "target_val_loss": args.target_val_loss, "rule": args.rule, "cores": cores}
    result["job_repeats"] = args.job_repeats
    result.update(rows=rows, noise=noise, knee=knee(rows), fit=None)
    try:
        s_min, b_noise = fit([(r["batch"], r["steps"]) for r in rows if r["steps"] is not None])
    except ValueError as e:
        result["fit_error"] = str(e)
        result["jobs"] = runs
        return result
    result["fit"] = {"s_min": s_min, "b_noise": b_noise}
    for r in rows:
        r["predicted"] = steps_to_target(r["batch"], s_min, b_noise)
    for j in runs:
        net = Network(j["network"]["alpha"], j["network"]["beta"], j["network"]["gamma"])
        t_sync = AllreduceSync(net, j["grad_bytes"], "ring")(j["ranks"]) if j["ranks"] > 1 else 0.0
        j["t_sync_predicted"] = t_sync
        j["t_step_predicted"] = j["t_comp_calibrated"] + t_sync
        j["steps_predicted"] = steps_to_target(j["ranks"] * args.batch, s_min, b_noise)
        j["seconds_predicted"] = j["steps_predicted"] * j["t_step_predicted"]
        j["seconds"] = training_seconds(j["record"])
        j["t_step"] = None if j["seconds"] is None else j["seconds"] / j["record"]["step"]
    result["jobs"] = runs
    result["targets"] = targets(args, result)
    return result


def targets(args, result: dict) -> list[str]:
    """One line per target of the project: met, not met here (and where), or not measurable."""
    lines = []
    rows = [r for r in result["rows"] if r["batch"] <= SPAN * args.batch]
    off = [
        f"B={r['batch']}" for r in rows if r["steps"] is None or abs(r["predicted"] / r["steps"] - 1) > STEPS_TOLERANCE
    ]
    aim = f"predicted steps within {100 * STEPS_TOLERANCE:.0f}% of the measured median from B to {SPAN}B"
    lines.append(_verdict(aim, off))
    k, b_noise = result["knee"], result["fit"]["b_noise"]
    aim = f"fitted critical batch B_noise within {KNEE_FACTOR:g}x of the measured curve's knee"
    if k is None:
        lines.append(f"project target: {aim} (not measurable here: the steps never fell to half)")
    else:
        lines.append(
            _verdict(aim, [] if 1 / KNEE_FACTOR <= b_noise / k <= KNEE_FACTOR else [f"{b_noise:.3g} vs {k:.3g}"])
        )
    for transport in sorted({j["transport"] for j in result["jobs"]}):
        mine = [j for j in result["jobs"] if j["transport"] == transport]
        off = [
            f"R={j['ranks']}"
            for j in mine
            if j["seconds"] is None or abs(j["seconds_predicted"] / j["seconds"] - 1) > TIME_TOLERANCE
        ]
        lines.append(_verdict(f"{transport}: predicted time to target within {100 * TIME_TOLERANCE:.0f}%", off))
        reached = [j for j in mine if j["seconds"] is not None]
        if reached:
            fastest = min(reached, key=lambda j: j["seconds"])["ranks"]
            picked = min(mine, key=lambda j: j["seconds_predicted"])["ranks"]
            miss = [] if fastest == picked else [f"model picks R={picked}, R={fastest} was fastest"]
            lines.append(_verdict(f"{transport}: the model names the fastest R", miss))
    # More ranks than cores take turns on them: every step waits for a rank that is not running,
    # which neither term of the model describes (T_comp is timed with the ranks at once, but a rank
    # between two turns is not computing slower, it is not computing at all).
    cores = result["cores"]
    if shared := sorted({j["ranks"] for j in result["jobs"] if j["ranks"] > cores}):
        ranks = ", ".join(f"R={r}" for r in shared)
        lines.append(f"({ranks}: more ranks than the {cores} cores here take turns on them: the model leaves that out)")
    return lines


def _verdict(aim: str, off: list[str]) -> str:
    return f"project target: {aim}: " + ("met" if not off else f"not met here ({', '.join(off)})")


def job_line(j: dict) -> str:
    rec = j["record"]
    if not rec["reached"]:
        return f"target not reached in {rec['step']} steps"
    return f"{rec['step']} steps, {rec['wall_s']:.2f} s ({rec.get('eval_s', 0.0):.2f} s of it scoring)"


def _n(v, fmt: str) -> str:
    return "missed" if v is None else format(v, fmt)


def render(result: dict) -> list[str]:
    out = [
        f"\nsteps to held-out loss <= {result['target_val_loss']:g}, one process at each global batch (median of seeds)"
    ]
    headers = ("global batch", "tuned lr", "steps", "predicted", "error", f"{result['rule']} rule lr", "rule steps")
    rows = []
    for r in result["rows"]:
        err = None if r["steps"] is None or "predicted" not in r else r["predicted"] / r["steps"] - 1
        pred = r.get("predicted")
        rows.append(
            (
                str(r["batch"]),
                f"{r['lr']:g}",
                _n(r["steps"], "g"),
                _n(pred, ".0f"),
                _n(err, "+.0%"),
                f"{r['rule_lr']:.3g}",
            )
            + (_n(r["rule_steps"], "g"),)
        )
    out.append(markdown_table(headers, rows))
    noise = result["noise"]
    measured = "none" if noise["b_noise"] is None else f"{noise['b_noise']:.3g}"
    if result["fit"] is None:
        return [*out, f"no fit: {result.get('fit_error')}"]
    f = result["fit"]
    knee = "none" if result["knee"] is None else f"{result['knee']:.3g}"
    out.append(f"fit S(B) = S_min(1 + B_noise/B): S_min {f['s_min']:.3g}, B_noise {f['b_noise']:.3g}; knee of the")
    out.append(f"measured curve {knee}; B_noise measured in training (batch {noise['batch']}): {measured}")
    repeats = result["job_repeats"]
    runs = f", the median of {repeats} runs each" if repeats > 1 else ""
    out.append(f"\nreal jobs to the target, per-rank batch {result['batch']}{runs}; {result['cores']} cores here")
    headers = ("transport", "R", "steps", "predicted", "T_step ms", "predicted", "seconds", "predicted", "error")
    rows = []
    for j in result["jobs"]:
        rec, secs = j["record"], j["seconds"]
        err = None if secs is None else j["seconds_predicted"] / secs - 1
        step_ms = None if j["t_step"] is None else j["t_step"] * 1e3
        rows.append(
            (j["transport"], str(j["ranks"]), _n(rec["step"] if rec["reached"] else None, "g"))
            + (f"{j['steps_predicted']:.0f}", _n(step_ms, ".3f"), f"{j['t_step_predicted'] * 1e3:.3f}")
            + (_n(secs, ".3f"), f"{j['seconds_predicted']:.3f}", _n(err, "+.0%"))
        )
    out.append(markdown_table(headers, rows))
    out.extend(step_split(result["jobs"]))
    return [*out, "", *result["targets"]]


def step_split(jobs: list[dict]) -> list[str]:
    """Where each job's step went against the model's two terms: the compute of the slowest rank
    (against T_comp calibrated with R ranks at once), the all-reduce itself (against the ring
    formula), and the rest, which the model leaves out: ranks waiting for one another, whose
    compute varies from step to step, and the loop's own bookkeeping."""
    headers = ("transport", "R", "T_step ms", "compute", "calibrated", "all-reduce", "modelled", "the rest")
    rows = []
    for j in jobs:
        if j["t_step"] is None:
            continue
        rest = j["t_step"] - j["compute_measured"] - j["allreduce_measured"]
        ms = [v * 1e3 for v in (j["t_step"], j["compute_measured"], j["t_comp_calibrated"])]
        ms += [v * 1e3 for v in (j["allreduce_measured"], j["t_sync_predicted"], rest)]
        rows.append((j["transport"], str(j["ranks"]), *(f"{v:.3f}" for v in ms)))
    if not rows:
        return []
    title = "\nthe measured step split as the model splits it, ms (compute: the slowest rank's median)"
    return [title, markdown_table(headers, rows)]


def plot(result: dict, path: Path) -> None:
    from ..figures.goodput import draw

    draw(result).savefig(path, dpi=120)
