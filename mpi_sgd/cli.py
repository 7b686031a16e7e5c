"""``mpi-sgd``: one entry point for the library's commands.

Each command lives in the module that owns its concern and registers itself through an
``add_parser(subparsers)`` function (:func:`mpi_sgd.args.add_command`: its flags a dataclass, its
``func`` run with them); this file only lists them. Usage errors exit 2 with the usage, as argparse
does, before any communication starts.
"""

from __future__ import annotations

import importlib
import sys

from .args import ArgumentParser, run_command
from .launch import JobFailed

# command -> the module that registers it. Only the command being run is imported: the
# benchmarks import torch (seconds on a busy host), and `mpi-sgd doctor` must answer quickly.
COMMANDS = {"bench": ".bench.cli", "doctor": ".cluster.doctor", "faults": ".faultmatrix", "figures": ".figures.run"}


def build_parser(only: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog="mpi-sgd", description=__doc__.splitlines()[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only in (None, name):
            importlib.import_module(module, __package__).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    only = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        return run_command(build_parser(only).parse_args(argv))
    except JobFailed as e:  # a job a benchmark started failed: its command and output, not our traceback
        print(f"mpi-sgd: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
