"""How late the parameter server's gradients arrive: the staleness histogram of each run.

From ``mpi-sgd bench async``'s JSON (``jobs``: one per scenario and R, each with its asynchronous
runs' staleness counts). A gradient computed on version v of the parameters and applied at
version V >= v is ``tau = V - v`` versions stale (:mod:`mpi_sgd.paramserver.staleness`). With
W workers of equal speed taking turns, each gradient finds the other W - 1 applied since its
pull: tau = W - 1. A straggler breaks the turns: the fast workers' gradients arrive almost
fresh, and each of the straggler's arrives many versions late.
"""

from __future__ import annotations

from collections import Counter

from ..paramserver.staleness import mean
from ..report import new_figure


def counts(job: dict) -> Counter:
    """Staleness counts of a job's asynchronous runs, summed over its rounds."""
    total: Counter = Counter()
    for run in job["runs"]["async"]:
        total.update({int(tau): n for tau, n in run["staleness"].items()})
    return total


def draw(result: dict):
    """One histogram per job of ``bench async``: gradients against tau, the mean and W - 1 marked."""
    jobs = result["jobs"]
    if not jobs:
        raise ValueError("bench async's JSON has no jobs to draw")
    fig, axes = new_figure(1, len(jobs), figsize=(4.6 * len(jobs), 3.8), squeeze=False)
    for ax, job in zip(axes[0], jobs, strict=True):
        c = counts(job)
        workers = job["ranks"] - 1  # bench async runs one server
        taus = range(max(c, default=0) + 1)
        total = sum(c.values())
        ax.bar(taus, [100 * c.get(t, 0) / max(total, 1) for t in taus], color="tab:orange", edgecolor="black", lw=0.4)
        ax.axvline(mean(c), color="black", lw=1.2, label=f"mean tau {mean(c):.2f}")
        ax.axvline(workers - 1, color="tab:blue", ls="--", lw=1.2, label=f"W - 1 = {workers - 1} (even turns)")
        slow = f", one worker {job['straggler_ms']:g} ms slower per gradient" if job.get("straggler_ms") else ""
        ax.set_title(f"{job['scenario']}: {workers} workers + 1 server{slow}", fontsize=9)
        ax.set(xlabel="staleness tau (versions late)", ylabel=f"% of the {total} gradients applied")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("asynchronous SGD: how many versions old each gradient is when the server applies it", fontsize=10)
    fig.tight_layout()
    return fig
