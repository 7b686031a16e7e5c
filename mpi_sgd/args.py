"""Command-line flags, declared one way: a frozen dataclass whose fields are the flags.

Each field made with :func:`flag` becomes ``--field-name``, with its help, its default and a
typed parser from this module; the dataclass's ``__post_init__`` checks what one value alone
cannot (two flags that go together, a range that depends on another flag). A script declares

    @dataclass(frozen=True)
    class Flags:
        length: int = flag(4, "elements per message", positive_int)

    parser = ArgumentParser(description=__doc__)
    args = parser.parse_flags(Flags)

and gets a checked ``Flags``. Every rank parses the same arguments and so fails the same way:
a malformed value prints the usage and the error once (on the launcher's rank 0), a value the
dataclass refuses prints one line, and every rank exits 2, before any communication, so no rank
is left waiting in a collective for a peer that has gone.

Counts and sizes share one grammar (:func:`quantity`): a number, in any form Python reads
(``1000003``, ``25.6e6``, ``1_000``), then an optional unit: ``K``, ``M``, ``G`` or ``B``
(billion), ``T`` for counts (``25M``, ``7.5B``); ``KiB``, ``MiB``, ``GiB``, ``TiB`` for bytes
(``1.5GiB``), where ``K``, ``M``, ``G`` and ``KB``, ``MB``, ``GB`` are read as binary too, as
the OSU micro-benchmarks read them.

Why one module of over 300 lines: the grammar of values (quantities, seconds), the parser's one-line
failures and the dataclass-to-argparse bridge are one contract that every script relies on; split
in two, each half would import the other.
"""

from __future__ import annotations

import argparse
import math
import re
import socket
import sys
import time
from dataclasses import MISSING, field, fields

from .launch import placement
from .refusal import end_job, mpi_started

# How long the other ranks let rank 0 go first when all refuse alike. Ranks reach their checks
# seconds apart on a loaded machine (importing torch alone takes a second or more), and a rank
# that speaks before rank 0 makes a second line; its only cost is to a rank refusing alone.
ROOT_FIRST_S = 3.0


class UsageError(ValueError):
    """A value this run cannot use, found before any communication: reported as one line, exit 2."""


# A module docstring's paragraph on why the module stays over 300 lines is for its maintainers.
_MAINTAINERS = re.compile(r"\n\nWhy (?:one module of )?over 300 lines:.*?(?=\n\n|\Z)", re.S)


class ArgumentParser(argparse.ArgumentParser):
    # Descriptions keep their line breaks (module docstrings serve as --help), less the
    # maintainers' paragraph. Sub-commands' parsers are of this class too, so they need not say so.
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        if kwargs.get("description"):
            kwargs["description"] = _MAINTAINERS.sub("", kwargs["description"])
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if placement().rank == 0:
            self.print_usage(sys.stderr)
        self.fail(message)

    def fail(self, message: str):
        """A value this run cannot use (rather than a malformed command line): one line, no usage.

        Before MPI starts, rank 0 writes it and ends the job (:func:`mpi_sgd.refusal.end_job`).
        Another rank first lets rank 0 go: where every rank refuses alike, rank 0's line is the
        only one, and the job ends before the others wake. One still running then refused alone
        (ranks that passed wait for it in MPI's start-up), so it writes its own line, naming
        itself, and ends the job. After MPI started, every rank refuses alike: rank 0's line only.
        """
        where, before_mpi = placement(), not mpi_started()  # (after, every rank runs the same checks)
        if where.rank == 0:
            sys.stderr.write(f"{self.prog}: error: {message}\n")
            sys.stderr.flush()
        elif where.size > 1:
            # Open MPI's launcher ends the job at the first rank to exit non-zero; one that left
            # before rank 0 had written its line would take the line with it.
            time.sleep(ROOT_FIRST_S)
            if before_mpi:
                sys.stderr.write(f"{self.prog}: error on rank {where.rank} ({socket.gethostname()}): {message}\n")
                sys.stderr.flush()
        if where.size > 1 and before_mpi:
            end_job(2)
        sys.exit(2)

    def add_flags(self, cls, only: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()) -> None:
        """One ``--flag`` per :func:`flag` field of the dataclass ``cls`` (``only`` those, none of ``skip``)."""
        for f in flag_fields(cls):
            if (only is None or f.name in only) and f.name not in skip:
                _add_flag(self, f)

    def build(self, cls, namespace: argparse.Namespace, **given):
        """``cls`` from the parsed flags, ``given`` filling fields not offered as flags; a ValueError
        raised by its checks becomes one line and exit 2."""
        values = {f.name: getattr(namespace, f.name) for f in flag_fields(cls) if hasattr(namespace, f.name)}
        try:
            return cls(**{**values, **given})
        except ValueError as e:
            self.fail(str(e))

    def given(self, argv: list[str] | None = None) -> set[str]:
        """The flags on the command line (``argv``, by default this process's), by field name: what
        a user asked for, told apart from a default (a resumed run keeps its own unless asked)."""
        words = sys.argv[1:] if argv is None else argv
        actions = self._option_string_actions
        return {actions[w.split("=", 1)[0]].dest for w in words if w.split("=", 1)[0] in actions}

    def parse_flags(self, cls, argv: list[str] | None = None, **given):
        """Every flag of ``cls`` added, the command line parsed, and ``cls`` built from it."""
        self.add_flags(cls, skip=tuple(given))
        return self.build(cls, self.parse_args(argv), **given)


def add_command(subparsers, name: str, flags, func, **kwargs) -> ArgumentParser:
    """A sub-command ``name`` whose flags are the dataclass ``flags``; ``func(flags_instance)`` runs it."""
    parser = subparsers.add_parser(name, **kwargs)
    parser.add_flags(flags)
    parser.set_defaults(func=func, flags=flags, parser=parser)
    return parser


def run_command(namespace: argparse.Namespace) -> int:
    """Build the chosen sub-command's flags and run it; a :class:`UsageError` it raises before
    communicating is one line and exit 2, like a value its flags refuse."""
    parser = namespace.parser
    try:
        return int(namespace.func(parser.build(namespace.flags, namespace)) or 0)
    except UsageError as e:
        parser.fail(str(e))


# -- declaring flags: dataclass fields ------------------------------------------------------------
def flag(
    default,
    help: str,
    type=None,
    *,
    choices=None,
    metavar: str | None = None,
    names: tuple[str, ...] = (),
    required: bool = False,
    rest: bool = False,
    positional: bool = False,
):
    """A dataclass field that is also the flag ``--name`` (and ``names``, e.g. ``("-f",)``).

    ``type`` parses the text (by default: from the default's type, :func:`integer` for ints,
    on/off ``--x``/``--no-x`` for bools); ``choices`` limits it. A ``required`` flag must be given
    on the command line; ``default`` is then what the dataclass holds when built in code. A
    ``rest`` field is no flag but the list of every argument after the others (a command to run);
    a ``positional`` one is a list of zero or more words among the flags, each parsed by ``type``.
    """
    meta = dict(help=help, type=type, choices=choices, metavar=metavar, names=names, required=required, rest=rest)
    meta["positional"] = positional
    if isinstance(default, list):  # a list default must be fresh for every instance
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_fields(cls) -> list:
    """The fields of ``cls`` that are flags, in declaration order."""
    return [f for f in fields(cls) if "help" in f.metadata]


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default(f):
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def _add_flag(parser: argparse.ArgumentParser, f) -> None:
    meta, default = f.metadata, _default(f)
    if meta["rest"]:
        parser.add_argument(f.name, nargs=argparse.REMAINDER, default=default, help=meta["help"])
        return
    if meta["positional"]:
        parser.add_argument(
            f.name, nargs="*", type=meta["type"], default=default, metavar=meta["metavar"], help=meta["help"]
        )
        return
    names = (flag_name(f.name), *meta["names"])
    # A flag whose default is None says in its help what leaving it out means.
    shown = meta["required"] or default is None
    help = meta["help"] if shown else f"{meta['help']} (default: {_shown(default, meta['type'])})"
    if meta["type"] is bool or isinstance(default, bool):
        parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=help)
        return
    # A float field's range and finiteness are its dataclass's to judge (one line, no usage).
    kind = meta["type"] or {int: integer, float: float}.get(type(default), str)
    kind = integer if kind is int else kind
    parser.add_argument(
        *names,
        dest=f.name,
        type=kind,
        default=default,
        required=meta["required"],
        choices=meta["choices"],
        help=help,
        metavar=meta["metavar"] or (None if meta["choices"] else f.name.upper()),
    )


def _shown(default, kind) -> str:
    """A default as a user would type it: lists comma-separated, sizes in binary units."""
    if isinstance(default, list | tuple):
        return ",".join("x".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in default)
    if kind is nbytes and default:
        exponent = max(e for e in range(5) if default % (1 << 10 * e) == 0)
        return f"{default >> 10 * exponent}{('B', 'KiB', 'MiB', 'GiB', 'TiB')[exponent]}"
    return str(default)


# -- argparse ``type=`` functions: a bad value becomes the usage, the message and exit 2 ----------
_COUNT = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9, "T": 10**12}
_BYTES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_QUANTITY = re.compile(r"\s*([-+]?[\d_.]+(?:[eE][-+]?\d+)?)\s*([a-zA-Z]*)\s*")


def quantity(text: str, unit: str = "count") -> float:
    """'25M', '25.6e6', '7.5B' -> counts; with ``unit='bytes'``: '1.5GiB', '64 KB', '4096' -> bytes.

    Counts take decimal units (K, M, G or B for billion, T); bytes take binary ones (KiB, MiB,
    GiB, TiB; K, M, G, KB, MB, GB read as binary too, as OSU does; B alone is bytes).
    """
    scales, hint = (_BYTES, "4096, 64KiB, 16MiB, 1.5GiB") if unit == "bytes" else (_COUNT, "1000, 25M, 25.6e6, 7.5B")
    m = _QUANTITY.fullmatch(text)
    suffix = m.group(2).upper() if m else ""
    if unit == "bytes":
        suffix = suffix.removesuffix("B").removesuffix("I")
    try:
        value = float(m.group(1)) * scales[suffix] if m else math.nan
    except (KeyError, ValueError):
        value = math.nan
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"not a {'size' if unit == 'bytes' else 'number'}: {text!r} (try {hint})")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _whole(text: str, unit: str = "count") -> int:
    value = quantity(text, unit)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(value)


def integer(text: str) -> int:
    """Any whole number, in the grammar of :func:`quantity`: '-1', '1e6', '25M'."""
    return _whole(text)


def _at_least(value, low, text: str, strictly: bool = False):
    if value < low or strictly and value == low:
        raise argparse.ArgumentTypeError(f"must be {'>' if strictly else '>='} {low}, got {text}")
    return value


def nonneg_int(text: str) -> int:
    return _at_least(_whole(text), 0, text)


def positive_int(text: str) -> int:
    """A count of at least 1: '3', '60000', '60k', '25M', '25.6e6', '7.5B'."""
    return _at_least(_whole(text), 1, text)


def nbytes(text: str) -> int:
    """A size of at least one byte: '4096', '64KiB', '16MiB', '1.5GiB'; 'MB' is read as MiB, as OSU does."""
    value = _whole(text, "bytes")
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def number(text: str) -> float:
    """Any finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def nonneg_float(text: str) -> float:
    return _at_least(number(text), 0, text)


def positive_float(text: str) -> float:
    return _at_least(number(text), 0, text, strictly=True)


def _listed(text: str, parse, what: str) -> list:
    values = [parse(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, got {text!r}")
    return values


def positive_floats(text: str) -> list[float]:
    """'0.25,1,4' -> [0.25, 1.0, 4.0]: each > 0, order kept."""
    return _listed(text, positive_float, "numbers")


def positive_ints(text: str) -> list[int]:
    """'8,16,16,4' -> [8, 16, 16, 4]: each at least 1, order and repeats kept."""
    return _listed(text, positive_int, "integers")


def layer_widths(text: str) -> list[int]:
    """'784,1024,10' -> [784, 1024, 10]: an MLP's widths, input to output, so at least two."""
    widths = positive_ints(text)
    if len(widths) < 2:
        raise argparse.ArgumentTypeError(
            f"an MLP needs at least an input and an output width, e.g. 784,1024,10; got {text!r}"
        )
    return widths


def depths_by_widths(text: str) -> list[tuple[int, int]]:
    """'0x10,3x100' -> [(0, 10), (3, 100)]: MLPs as hidden layers x width, each width at least 1."""
    specs = []
    for part in text.split(","):
        try:
            layers, width = (int(v) for v in part.strip().lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected LAYERSxWIDTH like 3x100, got {part!r}") from None
        if layers < 0 or width < 1:
            raise argparse.ArgumentTypeError(f"layers must be >= 0 and width >= 1, got {part!r}")
        specs.append((layers, width))
    return specs


def rank_list(text: str) -> list[int]:
    """'8,1,2,4,2' -> [1, 2, 4, 8]: world sizes to tabulate, sorted, each once."""
    return sorted(set(positive_ints(text)))


def choices_list(choices, what: str = "name"):
    """An argparse ``type=``: 'a,b' -> ['a', 'b'], each one of ``choices``, order kept."""

    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",") if part.strip()]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what}(s) {', '.join(bad) or repr(text)}; choose from {','.join(choices)}"
            )
        return names

    return parse
