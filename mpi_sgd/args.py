"""Command-line parsing for scripts that every rank of a job runs.

Every rank parses the same arguments and so fails the same way; this parser prints the usage
and the error once (on the launcher's rank 0) and exits 2 on every rank, before any
communication, so a typo gives one clear message instead of one per rank, and no rank is left
waiting in a collective for a peer that has gone.
"""

from __future__ import annotations

import argparse
import math
import sys

from .launch import placement


class ArgumentParser(argparse.ArgumentParser):
    # Descriptions keep their line breaks (module docstrings serve as --help). Sub-commands'
    # parsers are of this class too, so they need not say so.
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if placement().rank == 0:
            self.print_usage(sys.stderr)
        self.fail(message)

    def fail(self, message: str):
        """A value this run cannot use (rather than a malformed command line): one line, no usage."""
        if placement().rank == 0:
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


# -- argparse ``type=`` functions: a bad value becomes the usage, the message and exit 2 ----
def _number(text: str, kind=float):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def nonneg_float(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def positive_floats(text: str) -> list[float]:
    """'0.25,1,4' -> [0.25, 1.0, 4.0]: each > 0, order kept."""
    values = [positive_float(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers, got {text!r}")
    return values


def positive_ints(text: str) -> list[int]:
    """'8,16,16,4' -> [8, 16, 16, 4]: each at least 1, order and repeats kept."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}")
    return values


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


def rank_list(text: str) -> list[int]:
    """'8,1,2,4,2' -> [1, 2, 4, 8]: world sizes to tabulate, sorted, each once."""
    return sorted(set(positive_ints(text)))


def nbytes(text: str) -> int:
    """'4096', '64KiB', '16MiB', '1GiB' -> bytes. 'MB' is read as MiB, as OSU does."""
    from .report import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
