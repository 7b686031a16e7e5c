"""Results as people and programs read them: sizes in bytes, markdown tables, JSON files, PNGs.

Below the library's measuring code (calibration, the trainer's metrics, the benchmarks), so that
everything writes its tables and files one way. No MPI and no torch here; matplotlib is imported
only when a figure is drawn.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .args import flag


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GiB"


def ranks_text(ranks: Sequence[int]) -> str:
    """'rank 2', 'ranks 0, 3': the ranks a message is about."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    return "\n".join(lines)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v != v:  # nan: not measured
            return "-"
        # three significant digits below 10, tenths up to 1000, whole units above (a tenth of a
        # thousand is below any noise this measures, and six-digit columns must still fit 120)
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    """Write atomically: a reader never sees half a file. A float that is not finite (a diverged
    loss, a time not measured) is written as ``null``: bare ``NaN`` is not JSON, and strict
    readers (``jq``, JavaScript, most languages' parsers) refuse the whole file for it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_finite(payload), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def check_output_file(path: str, flag: str) -> None:
    """Raise ValueError (one line) unless :func:`write_json` can write ``path``, tried at start by
    making and removing a file where it would write: a run must not train for an hour and then
    fail to save what it measured. Its missing parent folders are made when it writes."""
    if not path:
        raise ValueError(f"{flag} needs a file name (leave the flag out to write none)")
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise ValueError(f"{flag} {path!r} is a directory; give the name of a file to write")
    parent = os.path.dirname(target)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{flag} {path!r} cannot be written: {parent!r} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=parent)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ValueError(
            f"{flag} {path!r} cannot be written: no file can be made in {parent!r} ({e.strerror or e})"
        ) from None


@dataclass(frozen=True)
class Output:
    """The flags every benchmark shares (its flags' dataclass derives from this): where its JSON and PNG go."""

    out_dir: str = flag("results", "folder for the JSON and PNG")
    plot: bool = flag(True, "draw the PNG (--no-plot: skip it)")


def save_results(args, name: str, payload: dict, plot=None) -> Path:
    """Write ``<out-dir>/<name>.json`` and, unless ``--no-plot``, ``plot(png_path)`` beside it; say where."""
    out = write_json(Path(args.out_dir) / f"{name}.json", payload)
    if plot is not None and args.plot:
        plot(out.with_suffix(".png"))
        print(f"\nwrote {out} and {out.with_suffix('.png')}")
    else:
        print(f"\nwrote {out}")
    return out


def new_figure(nrows: int = 1, ncols: int = 1, **kw):
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on compute nodes
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, **kw)


def plot_by_size(path, series: dict, ylabel: str, title: str) -> None:
    """One log-log line per name in ``series`` ({name: (sizes in bytes, times in us)}), saved to ``path``."""
    fig, ax = new_figure(figsize=(7, 4.5))
    for name, (sizes, times) in series.items():
        ax.loglog(sizes, times, marker="o", ms=3, label=name)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
