"""Command-line parsing for scripts that every rank of a job runs.

Every rank parses the same arguments and so fails the same way; this parser prints the usage
and the error once (on the launcher's rank 0) and exits 2 on every rank, before any
communication, so a typo gives one clear message instead of one per rank, and no rank is left
waiting in a collective for a peer that has gone.
"""

from __future__ import annotations

import argparse
import sys

from .launch import placement


class ArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if placement().rank == 0:
            self.print_usage(sys.stderr)
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)
