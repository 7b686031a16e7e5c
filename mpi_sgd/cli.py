"""``mpi-sgd``: one entry point for the library's commands.

Each command lives in the module that owns its concern and registers itself through an
``add_parser(subparsers)`` function that sets ``func`` on its parser; this file only lists them.
Usage errors exit 2 with the usage, as argparse does, before any communication starts.
"""

from __future__ import annotations

import sys

from .args import ArgumentParser


def build_parser() -> ArgumentParser:
    from . import faultmatrix
    from .bench import cli as bench_cli

    parser = ArgumentParser(prog="mpi-sgd", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench_cli.add_parser(sub)
    faultmatrix.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
