"""MkDocs hook: the parts of the site generated from the code at build time.

* ``<!-- cli: ENTRY -->`` on a page becomes ENTRY's reference (usage, description, a table of
  its options, its sub-commands), rendered from the parser the entry point really builds
  (``commandlines.py``, run in a process of its own: the build never imports torch or MPI itself);
* the docstrings' Sphinx roles (``:class:`~a.b.C` ``), which mkdocstrings prints as they are, read as
  code (``C``; the full path without the ``~``);
* ``contributing/floors.svg`` is drawn from ``FLOORS`` in ``tests/unit/test_floors.py``, the one
  definition of which module may import which, so the picture cannot drift from what is checked.
"""

from __future__ import annotations

import ast
import html
import json
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.structure.files import File

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MARKER = re.compile(r"^<!-- cli: (.+?) -->$", re.M)
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([^<]+)</code>")
_reference: dict[str, str] = {}


def cli_reference() -> dict[str, str]:
    if not _reference:
        done = subprocess.run(
            [sys.executable, str(HERE / "commandlines.py")], cwd=ROOT, capture_output=True, text=True, timeout=600
        )
        if done.returncode:
            raise RuntimeError(f"rendering the CLI reference failed:\n{done.stderr}")
        _reference.update(json.loads(done.stdout))
    return _reference


def on_page_markdown(markdown: str, page, config, files) -> str:
    def expand(match: re.Match) -> str:
        entry = match.group(1)
        if entry not in cli_reference():
            raise KeyError(f"{page.file.src_uri}: no entry point {entry!r}; known: {', '.join(cli_reference())}")
        return cli_reference()[entry]

    return MARKER.sub(expand, markdown)


def on_page_content(html_text: str, page, config, files) -> str:
    return ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html_text)


# -- the floors ------------------------------------------------------------------------------------
def floors() -> list[tuple[str, ...]]:
    """FLOORS from the floors test, read without importing it (bottom floor first)."""
    tree = ast.parse((ROOT / "tests" / "unit" / "test_floors.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["FLOORS"]:
            return [tuple(ast.literal_eval(floor)) for floor in node.value.elts]
    raise LookupError("FLOORS not found in tests/unit/test_floors.py")


def floors_svg() -> str:
    """The floors as stacked bands, the top floor drawn on top; packages end in '/'."""
    rows = floors()[::-1]
    width, row, pad, top = 860, 46, 6, 34
    height = top + len(rows) * row + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="14">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
        "mpi_sgd, floor by floor: a module imports only from its own floor and those below</text>",
    ]
    for i, units in enumerate(rows):
        y = top + i * row
        level = len(rows) - 1 - i
        shade = 235 - 12 * (level % 2)
        out.append(
            f'<rect x="70" y="{y + pad / 2}" width="{width - 80}" height="{row - pad}" rx="6" '
            f'fill="rgb({shade},{shade},250)" stroke="#5c6bc0"/>'
        )
        out.append(f'<text x="16" y="{y + row / 2 + 5}" fill="#3949ab">floor {level}</text>')
        names = "   ".join(u + ("/" if (ROOT / "mpi_sgd" / u).is_dir() else "") for u in units)
        middle = 70 + (width - 80) / 2
        out.append(f'<text x="{middle}" y="{y + row / 2 + 5}" text-anchor="middle">{html.escape(names)}</text>')
    out.append(
        f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle" fill="#555">'
        "imports point down only; tests/unit/test_floors.py checks every import</text>"
    )
    out.append("</svg>")
    return "\n".join(out)


def on_files(files, config):
    files.append(File.generated(config, "contributing/floors.svg", content=floors_svg()))
    return files
