"""Flags declared one way (mpi_sgd.args): the count and size grammar, and the dataclass builder."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from mpi_sgd.args import (
    ArgumentParser,
    UsageError,
    add_command,
    flag,
    flag_fields,
    integer,
    nbytes,
    positive_int,
    quantity,
    run_command,
)
from tests.entry_points import run
from tests.helpers import prints_usage_errors


@pytest.mark.parametrize(
    "text, value",
    [
        ("25M", 25_000_000),
        ("25.6e6", 25_600_000),
        ("7.5B", 7_500_000_000),  # B is a billion parameters...
        ("1_000_003", 1_000_003),
        ("60k", 60_000),
        ("1.5K", 1_500),
        ("2T", 2 * 10**12),
        ("-1", -1),
    ],
)
def test_counts(text, value):
    assert integer(text) == value


@pytest.mark.parametrize(
    "text, value",
    [
        ("1.5GiB", 3 << 29),
        ("64 KB", 64 << 10),  # ...and here a byte; KB, MB, GB are binary, as OSU reads them
        ("4096", 4096),
        ("4096B", 4096),
        ("16MiB", 16 << 20),
        ("1k", 1024),
        ("1GB", 1 << 30),
    ],
)
def test_sizes(text, value):
    assert nbytes(text) == value


@pytest.mark.parametrize(
    "parse, text, message",
    [
        (integer, "2.5", "not a whole number"),
        (integer, "lots", "not a number: 'lots' (try 1000, 25M"),
        (integer, "1.5GiB", "not a number"),  # a size is no count
        (integer, "", "not a number"),
        (integer, "1e400", "not a finite number"),
        (positive_int, "0", "must be >= 1"),
        (nbytes, "0", "size must be positive"),
        (nbytes, "-4", "size must be positive"),
        (nbytes, "0.5B", "not a whole number"),
        (nbytes, "lots", "not a size: 'lots' (try 4096"),
    ],
)
def test_refusals_say_what_to_type(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace("(", r"\(")):
        parse(text)


def test_quantity_is_the_one_grammar():
    assert quantity("7.5B") == 7.5e9 and quantity("7.5GiB", "bytes") == 7.5 * 2**30


@pytest.mark.parametrize(
    "entry, base",
    [
        ("examples/speedup.py", ["--t-comp", "1", "--network", "ib100"]),
        ("examples/which_strategy.py", ["--memory", "1GiB", "--ranks", "4", "--network", "10gbe"]),
        ("examples/will_it_fit.py", []),
    ],
)
@pytest.mark.parametrize("text, value", [("25M", 25_000_000), ("25.6e6", 25_600_000), ("7.5B", 7_500_000_000)])
def test_every_parameter_count_flag_reads_the_grammar(entry, base, text, value, monkeypatch):
    r = run(entry, [*base, "--params", text], monkeypatch)
    assert r.code in (None, 0), r.err
    assert r.built[-1].params == value


@dataclass(frozen=True)
class Flags:
    widths: list = flag([1, 2], "some widths", lambda t: [int(v) for v in t.split(",")])
    size: int = flag(16 << 20, "a size", nbytes)
    name: str = flag("", "a name", required=True)
    quiet: bool = flag(False, "say less")
    colour: str | None = flag(None, "a colour; none: the terminal's", choices=("red", "blue"))
    note: str = field(default="not a flag")

    def __post_init__(self):
        if self.colour == "red" and self.quiet:
            raise ValueError("--colour red is loud")


def test_fields_become_flags_with_help_and_defaults_as_typed():
    parser = ArgumentParser(prog="x")
    parser.add_flags(Flags)
    helps = {a.option_strings[0]: a.help for a in parser._actions[1:]}
    assert helps == {
        "--widths": "some widths (default: 1,2)",
        "--size": "a size (default: 16MiB)",
        "--name": "a name",
        "--quiet": "say less (default: False)",
        "--colour": "a colour; none: the terminal's",
    }
    assert [f.name for f in flag_fields(Flags)] == ["widths", "size", "name", "quiet", "colour"]


def test_build_parses_and_checks():
    a = ArgumentParser(prog="x").parse_flags(Flags, ["--name", "n", "--size", "1GiB", "--no-quiet", "--widths", "3"])
    assert (a.name, a.size, a.quiet, a.widths, a.note) == ("n", 1 << 30, False, [3], "not a flag")
    b = ArgumentParser(prog="x").parse_flags(Flags, ["--name", "n"])
    assert b.widths == [1, 2] and b.widths is not Flags(name="m").widths  # a fresh list each time


def test_only_and_skip_choose_the_flags(capsys):
    parser = ArgumentParser(prog="x")
    parser.add_flags(Flags, only=("name", "quiet"), skip=("quiet",))
    assert [a.dest for a in parser._actions[1:]] == ["name"]
    assert parser.build(Flags, parser.parse_args(["--name", "n"]), quiet=True).quiet


def test_a_malformed_value_gives_the_usage_a_refused_one_a_line(capsys):
    with pytest.raises(SystemExit) as e:
        ArgumentParser(prog="x").parse_flags(Flags, ["--name", "n", "--size", "lots"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert ("usage: x" in err and "argument --size: not a size" in err) if prints_usage_errors() else err == ""
    with pytest.raises(SystemExit) as e:
        ArgumentParser(prog="x").parse_flags(Flags, ["--name", "n", "--colour", "red", "--quiet"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("x: error: --colour red is loud\n" if prints_usage_errors() else "")


def test_a_command_refusing_before_it_communicates_is_one_line(capsys):
    def refuse(flags):
        raise UsageError(f"no {flags.name} here")

    parser = ArgumentParser(prog="tool")
    add_command(parser.add_subparsers(dest="command"), "go", Flags, refuse)
    with pytest.raises(SystemExit) as e:
        run_command(parser.parse_args(["go", "--name", "n"]))
    assert e.value.code == 2
    assert capsys.readouterr().err == ("tool go: error: no n here\n" if prints_usage_errors() else "")


def test_help_leaves_out_the_maintainers_paragraph():
    # A module docstring serves as --help; its paragraph on why the module is long is not for users.
    doc = "What it does.\n\nWhy one module of over 300 lines: reasons.\nMore reasons.\n\nHow to use it."
    text = ArgumentParser(prog="p", description=doc).format_help()
    assert "What it does." in text and "How to use it." in text and "reasons" not in text
    last = ArgumentParser(prog="p", description="What it does.\n\nWhy over 300 lines: reasons.\n").format_help()
    assert "What it does." in last and "reasons" not in last
