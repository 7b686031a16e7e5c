"""The project's command lines and the real argparse parsers behind them, for the docs.

The docs never copy a parser: the CLI reference is rendered from the parser each entry point
builds, and the docs tests hand every command line a page shows to that same parser. A script's
parser is caught as the script calls ``parse_args`` (it is run up to that point and no further),
so what a page is checked against is exactly what a user's command meets.

``python docs/hooks/commandlines.py`` prints the reference of every entry point as JSON (the docs
hook runs it in a process of its own, so the site build never imports torch or MPI itself).
"""

from __future__ import annotations

import argparse
import contextlib
import html
import io
import json
import runpy
import shlex
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Modules a user runs with `python -m`; each builds its parser in main().
MODULES = ("mpi_sgd.paramserver", "mpi_sgd.calibrate", "mpi_sgd.cluster.netns")
# Runnable modules that are not a user's command line, and why.
INTERNAL = {
    "mpi_sgd.cli": "the `mpi-sgd` command itself",
    "mpi_sgd.cluster.probe": "what `mpi-sgd doctor` runs on each host over ssh",
    "mpi_sgd.bench.validate": "the training job `mpi-sgd bench validate` launches (sync_sgd.py's flags)",
    "mpi_sgd.figures.ring": "the recorded ring all-reduce `mpi-sgd figures ring-allreduce` launches",
}

# mpiexec/mpirun/srun options that take one or two values (hydra's, Open MPI's and Slurm's spellings).
LAUNCHER_VALUES = {
    **dict.fromkeys(("-n", "-np", "-hosts", "-host", "--host", "-f", "-hostfile", "--hostfile", "-machinefile"), 1),
    **dict.fromkeys(("-iface", "-ppn", "-launcher-exec", "-bind-to", "--bind-to", "--map-by", "-x"), 1),
    **dict.fromkeys(("-genv", "-env", "--mca"), 2),
}
LAUNCHER_FLAGS = {"-disable-auto-cleanup", "--oversubscribe", "--allow-run-as-root", "-l", "-prepend-rank", "--version"}
LAUNCHERS = {"mpiexec", "mpirun", "srun"}


def examples() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.py"))


def runnable_modules() -> list[str]:
    """Every module of the package that runs with `python -m`: a package's __main__ or a main guard."""
    found = []
    for path in sorted((ROOT / "mpi_sgd").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if path.name == "__main__.py":
            found.append(".".join(parts[:-1]))
        elif 'if __name__ == "__main__":' in path.read_text():
            found.append(".".join(parts))
    return found


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


@contextlib.contextmanager
def _catching_parsers(argv0: str):
    """While inside, the first parser asked to parse is raised as _Caught instead."""

    def catch(self, args=None, namespace=None):
        raise _Caught(self)

    original, saved_argv = argparse.ArgumentParser.parse_known_args, sys.argv
    argparse.ArgumentParser.parse_known_args = catch
    sys.argv = [argv0]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args, sys.argv = original, saved_argv


_PARSERS: dict[str, argparse.ArgumentParser] = {}


def parser_of(entry: str) -> argparse.ArgumentParser:
    """The parser behind ``entry``: 'examples/x.py', 'python -m mod' or 'mpi-sgd'."""
    if entry not in _PARSERS:
        if entry == "mpi-sgd":
            from mpi_sgd.cli import build_parser

            _PARSERS[entry] = build_parser()
        else:
            module = entry.removeprefix("python -m ") if entry.startswith("python -m ") else None
            try:
                with _catching_parsers(module or str(ROOT / entry)):
                    if module:
                        # Another page's check (or a test) may have imported the module already;
                        # running a fresh copy as __main__ is what reaches its parser, so runpy's
                        # warning that the two copies differ says nothing here.
                        with warnings.catch_warnings():
                            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                            runpy.run_module(module, run_name="__main__", alter_sys=True)
                    else:
                        runpy.run_path(str(ROOT / entry), run_name="__main__")
            except _Caught as caught:
                _PARSERS[entry] = caught.parser
            else:
                raise LookupError(f"{entry} finished without parsing a command line")
    return _PARSERS[entry]


# -- command lines as a page shows them ------------------------------------------------------------
@dataclass
class Command:
    """One command line, taken apart: what runs it and the words its own parser gets."""

    text: str
    sudo: bool  # shown with a leading sudo (dropped when already root)
    launcher: str | None  # mpiexec, mpirun, srun or None
    program: list[str]  # the words from the program on: ['python', 'examples/x.py', '--flag', ...]

    @property
    def entry(self) -> str | None:
        """The entry point, as parser_of names it, or None for a program with no parser of ours."""
        words = self.program
        if words[:1] == ["mpi-sgd"]:
            return "mpi-sgd"
        if words[:1] in (["python"], ["python3"]) and len(words) > 1:
            if words[1] == "-m" and len(words) > 2 and words[2].startswith("mpi_sgd"):
                return f"python -m {words[2]}"
            if words[1].startswith("examples/") and words[1].endswith(".py"):
                return words[1]
        return None

    @property
    def arguments(self) -> list[str]:
        """The words the entry point's parser gets."""
        skip = {"mpi-sgd": 1}.get(self.entry, 3 if self.program[1:2] == ["-m"] else 2)
        return self.program[skip:]

    @property
    def inner(self) -> Command | None:
        """The command a wrapper runs (the namespace cluster runs what follows `--`)."""
        if self.entry == "python -m mpi_sgd.cluster.netns" and "--" in self.program:
            return parse_command(shlex.join(self.program[self.program.index("--") + 1 :]))
        return None


def parse_command(text: str) -> Command:
    """'sudo A=1 mpiexec -n 2 python x.py --f 1  # why' -> its parts. Raises ValueError on a launcher
    option it does not know, so a new spelling gets taught here rather than silently misread."""
    words = shlex.split(text, comments=True)
    sudo = words[:1] == ["sudo"]
    words = words[1:] if sudo else words
    while words and (words[0] == "env" or ("=" in words[0] and not words[0].startswith("-"))):
        words = words[1:]  # environment assignments, with or without `env`
    launcher = None
    if words and words[0] in LAUNCHERS:
        launcher, words = words[0], words[1:]
        while words and words[0].startswith("-"):
            option = words[0].split("=")[0]
            if option in LAUNCHER_FLAGS or "=" in words[0]:
                words = words[1:]
            elif option in LAUNCHER_VALUES:
                words = words[1 + LAUNCHER_VALUES[option] :]
            else:
                raise ValueError(f"{launcher} option {words[0]!r} in {text!r}: add it to LAUNCHER_VALUES or _FLAGS")
    while words and "=" in words[0] and not words[0].startswith("-"):
        words = words[1:]
    return Command(text=text, sudo=sudo, launcher=launcher, program=words)


class _Refused(Exception):
    pass


def _refuse(self, message: str):
    raise _Refused(f"{self.prog}: error: {message}")


def refusal(command: Command) -> str | None:
    """Why the entry point's real parser refuses the command's flags, or None if it accepts them.

    The parser's own ``error`` prints on rank 0 only (under ``mpirun -n 2 pytest`` on both ranks
    alike it must still say why), so while it parses, an error is raised with its message instead."""
    if command.entry is None:
        return None
    parser = parser_of(command.entry)
    classes = {type(parser), argparse.ArgumentParser, *(type(p) for p in _subparsers(parser))}
    saved = {cls: cls.__dict__.get("error") for cls in classes}
    for cls in classes:
        cls.error = _refuse
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            parser.parse_args(command.arguments)
    except _Refused as e:
        return str(e)
    except SystemExit as e:  # --help, which exits 0
        if e.code not in (0, None):
            return f"{command.entry} exited {e.code} on {command.arguments}"
    finally:
        for cls, error in saved.items():
            if error is None:
                del cls.error
            else:
                cls.error = error
    inner = command.inner
    return refusal(inner) if inner else None


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += [sub, *_subparsers(sub)]
    return found


# -- the reference, as Markdown --------------------------------------------------------------------
def _cell(text: str) -> str:
    text = html.escape(" ".join(str(text).split()), quote=False)
    for ch in "\\`*_[]|":
        text = text.replace(ch, "\\" + ch)
    return text


def _option(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings) or action.dest
    if action.nargs == 0:
        return f"`{names}`"
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        return f"`{names} {{{','.join(map(str, action.choices))}}}`"
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    return f"`{names} {metavar if isinstance(metavar, str) else ' '.join(metavar)}`"


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0 or default is None or default == argparse.SUPPRESS or action.required:
        return "required" if action.required else ""
    if isinstance(default, (list, tuple)):
        default = ",".join(map(str, default))
    return f"`{default}`" if str(default) else ""


def markdown(parser: argparse.ArgumentParser, title: str, level: int = 2) -> str:
    """``parser`` as a section: its usage, its description and a table of its options; then each sub-command."""
    out = [f"{'#' * level} `{title}`", "", "```text", parser.format_usage().strip(), "```", ""]
    if parser.description:
        out += ["```text", parser.description.strip(), "```", ""]
    rows, subs = [], []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            subs += [(name, sub, helps.get(name)) for name, sub in action.choices.items()]
        elif action.help != argparse.SUPPRESS:
            rows.append(f"| {_option(action)} | {_default(action)} | {_cell(action.help or '')} |")
    if rows:
        out += ["| option | default | what it does |", "|---|---|---|", *rows, ""]
    if subs:
        out += ["| command | what it does |", "|---|---|"]
        out += [f"| [`{name}`](#{anchor(f'{title} {name}')}) | {_cell(help or '')} |" for name, _, help in subs]
        out.append("")
        for name, sub, _ in subs:
            out.append(markdown(sub, f"{title} {name}", level + 1))
    return "\n".join(out)


def anchor(title: str) -> str:
    """The id MkDocs' table of contents gives the heading `` `title` ``."""
    from markdown.extensions.toc import slugify

    return slugify(title, "-")


def entries() -> list[str]:
    return ["mpi-sgd", *examples(), *(f"python -m {m}" for m in MODULES)]


def reference() -> dict[str, str]:
    """Every entry point's section, by entry point."""
    return {entry: markdown(parser_of(entry), entry) for entry in entries()}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    json.dump(reference(), sys.stdout)
