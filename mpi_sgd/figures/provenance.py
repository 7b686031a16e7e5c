"""Where a figure came from: the command, the machine, the date and the load it ran under.

A figure measured on a busy machine is still a real measurement, but not one to set beside a
figure taken elsewhere. So every figure carries its provenance twice: one line of small print on
the image, and in full in a sidecar ``NAME.json`` written beside it by the same command.

The load is the kernel's one-minute load average (``os.getloadavg``), read before the command's
jobs start and after they end, beside the number of cores; the "before" reading is the other
work on the machine, the "after" one includes this command's own ranks. Above half a load unit
per core beforehand, the figure says it was measured under load.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..report import write_json

BUSY_PER_CORE = 0.5  # load per core beforehand above which a figure is "measured under load"


def cpu_model() -> str:
    """The processor's marketing name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """CPU, cores, memory and the software versions a figure's numbers depend on."""
    from importlib.metadata import PackageNotFoundError, version

    facts = {"cpu": cpu_model(), "cores": os.cpu_count(), "system": f"{platform.system()} {platform.release()}"}
    try:
        facts["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):  # not every platform names these
        pass
    facts["python"] = platform.python_version()
    for dist in ("torch", "mpi4py", "numpy", "matplotlib"):
        try:
            facts[dist] = version(dist)
        except PackageNotFoundError:
            facts[dist] = None
    try:
        from ..cluster.probe import mpi_library

        facts["mpi"] = mpi_library()[0]
    except Exception as e:  # no MPI here: the figure may still be drawn (the ring's needs one)
        facts["mpi"] = f"unavailable ({type(e).__name__})"
    return facts


def load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not available on this platform
        return float("nan")


@dataclass
class Provenance:
    """What a sidecar holds: the command, the jobs it ran, the machine, when, and the load."""

    figure: str
    command: str
    jobs: list[str] = field(default_factory=list)
    machine: dict = field(default_factory=machine)
    date: str = field(default_factory=lambda: datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
    load_before: float = field(default_factory=load_average)
    load_after: float = float("nan")
    seconds: float = 0.0
    _began: float = field(default_factory=time.perf_counter, repr=False)

    def finish(self) -> None:
        """The jobs are done: read the load again and the time they took."""
        self.load_after = load_average()
        self.seconds = round(time.perf_counter() - self._began, 2)

    @property
    def under_load(self) -> bool:
        return self.load_before > BUSY_PER_CORE * (self.machine.get("cores") or 1)

    def load_text(self) -> str:
        cores = self.machine.get("cores")
        text = f"load {self.load_before:.1f} before, {self.load_after:.1f} after, on {cores} cores"
        return text + (": measured under load" if self.under_load else "")

    def footer(self) -> str:
        """The one line printed on the image."""
        return f"{self.command}  |  {self.machine['cpu']}, {self.machine['cores']} cores  |  {self.date[:10]}  |  " + (
            self.load_text()
        )

    def record(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        out["load"] = self.load_text()
        return out

    @classmethod
    def from_record(cls, record: dict) -> Provenance:
        kept = {k: v for k, v in record.items() if k in cls.__dataclass_fields__ and not k.startswith("_")}
        for k in ("load_before", "load_after"):  # a load not measured: NaN, written as null (report.write_json)
            if k in kept and kept[k] is None:
                kept[k] = float("nan")
        return cls(**kept)


def save(fig, path: str | os.PathLike, provenance: Provenance) -> Path:
    """Stamp ``fig`` with its footer, write it (SVG or PNG by the suffix) and its sidecar JSON."""
    import matplotlib

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.text(0.005, -0.01, provenance.footer(), fontsize=6, color="0.35", ha="left", va="top")
    if path.suffix == ".svg":
        # No creation date and a fixed id salt: the same drawing gives the same file, so a figure
        # that did not change does not churn in version control.
        with matplotlib.rc_context({"svg.hashsalt": "mpi_sgd", "svg.fonttype": "none"}):
            fig.savefig(path, bbox_inches="tight", metadata={"Date": None})
    else:
        fig.savefig(path, dpi=130, bbox_inches="tight")
    write_json(path.with_suffix(".json"), provenance.record())
    import matplotlib.pyplot as plt

    plt.close(fig)  # drawn by pyplot's subplots: let it go, or a run of figures keeps them all
    return path
