"""The documentation as the docs tests read it: pages, their fenced blocks, the commands in them.

A page is README.md or any Markdown file under docs/. A fenced block may be preceded by HTML
comments that say how to test it (invisible on the site):

``<!-- slow: REASON -->``   not run by ``make test`` (its flags are still checked by the entry
                            point's real parser); ``make test-docs-slow`` runs it as written
``<!-- exit: N -->``        the commands end with exit status N (a fault drill), not 0
``<!-- output: exact -->``  a session's output must match number for number, not only word for word
``<!-- serves: URL -->``    the command serves until stopped: it passes once URL answers

A ``bash`` block holds commands, one per line (a trailing backslash continues a line), run from
the repository root. A ``text`` block whose first line starts with ``$ `` is a session: each
``$ `` line is a command and the lines after it are its output, where a line ``...`` stands for
any number of lines. Every ``python`` block opens with its launch line (``# mpiexec -n 2 python
my_sgd.py``) and runs as that file.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARK = re.compile(r"^\s*<!-- (slow|exit|output|serves): (.+?) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
# The host name the pages show; a run's real host name is read as this one.
SHOWN_HOST = "vm"


def pages() -> list[Path]:
    """README.md and every page of the site (docs/hooks/ holds the site's build code, not pages)."""
    return [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)]


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    lines: list[str]  # the block's content, its indentation removed
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def slow(self) -> str | None:
        return self.marks.get("slow")

    @property
    def exit_status(self) -> int:
        return int(self.marks.get("exit", "0"))

    @property
    def is_session(self) -> bool:
        return self.lang == "text" and bool(self.lines) and self.lines[0].startswith("$ ")

    def commands(self) -> list[str]:
        """The command lines a user types: every line of a bash block, the $ lines of a session."""
        if self.lang == "bash":
            joined, out = "", []
            for line in self.lines:
                joined += line.rstrip()
                if joined.endswith("\\"):
                    joined = joined[:-1] + " "
                    continue
                if joined.strip() and not joined.lstrip().startswith("#"):
                    out.append(joined.strip())
                joined = ""
            return out
        if self.is_session:
            return [line[2:] for line in self.lines if line.startswith("$ ")]
        return []

    def session(self) -> list[tuple[str, list[str]]]:
        """(command, the output shown for it) for each $ line of a session."""
        out: list[tuple[str, list[str]]] = []
        for line in self.lines:
            if line.startswith("$ "):
                out.append((line[2:], []))
            elif out:
                out[-1][1].append(line)
        return out


def blocks(page: Path) -> list[Block]:
    found, marks, current, indent = [], {}, None, 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if current is None:
            if fence:
                indent = len(fence.group(1))
                current = Block(name(page), number, fence.group(2), [], marks)
                marks = {}
            elif mark := MARK.match(line):
                marks = {**marks, mark.group(1): mark.group(2)}
            elif line.strip():
                marks = {}
        elif fence and len(fence.group(1)) == indent and not fence.group(2):
            found.append(current)
            current = None
        else:
            current.lines.append(line[indent:] if not line[:indent].strip() else line.lstrip())
    return found


def prose(page: Path) -> str:
    """The page without its fenced blocks and comments: what inline code spans are read from."""
    text = re.sub(r"^(\s*)```.*?^\1```\s*$", "", page.read_text(), flags=re.M | re.S)
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def inline_code(page: Path) -> list[str]:
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose(page))


COMMAND_START = re.compile(r"^(sudo |[A-Z_]+=\S+ )*(mpiexec|mpirun|mpi-sgd|make|python3? (examples/|-m mpi_sgd))\b")


def inline_commands(page: Path) -> list[str]:
    """Inline code that is a whole command line (`mpiexec -n 2 mpi-sgd bench zero`); elided ones
    (`mpiexec -n 4 ...`) and ones with a placeholder for the rank count (`-n R`) are left out."""
    return [
        code
        for code in inline_code(page)
        if COMMAND_START.match(code) and "..." not in code and "…" not in code and not re.search(r" -n [A-Z]\b", code)
    ]


FILE = re.compile(r"^(examples|mpi_sgd|tests|hostfiles|docker|docs)/[\w./-]*[\w/]$")


def named_files(page: Path) -> list[str]:
    """Paths into the repository that the page names, in inline code or in its commands."""
    words = list(inline_code(page))
    for block in blocks(page):
        for command in block.commands():
            words += command.split()
    return sorted({w.rstrip(".,;:") for w in words if FILE.match(w.rstrip(".,;:"))})


# -- output, as shown against output as printed --------------------------------------------------------
NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _normal(line: str, exact: bool) -> str:
    line = " ".join(line.split())
    return line if exact else NUMBER.sub("#", line)


def output_matches(shown: list[str], printed: str, exact: bool = False) -> bool:
    """Does ``printed`` read as ``shown``? Words must be equal and the lines in the same order; numbers
    must be numbers (timings, process IDs and rounding change from run to run) unless ``exact``;
    a shown line ``...`` stands for any number of printed lines."""
    host = socket.gethostname()
    got = [re.sub(rf"\b{re.escape(host)}\b", SHOWN_HOST, line) for line in printed.splitlines()]
    want = [_normal(line, exact) for line in shown]
    got = [_normal(line, exact) for line in got]
    while want and not want[-1]:
        want.pop()
    while got and not got[-1]:
        got.pop()

    memo: dict[tuple[int, int], bool] = {}

    def match(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i == len(want):
                memo[i, j] = j == len(got)
            elif want[i] == "...":
                memo[i, j] = match(i + 1, j) or (j < len(got) and match(i, j + 1))
            else:
                memo[i, j] = j < len(got) and want[i] == got[j] and match(i + 1, j + 1)
        return memo[i, j]

    return match(0, 0)
