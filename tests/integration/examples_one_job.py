"""Run several example scripts one after another inside one MPI job, as ``__main__`` each, with
its own command line: ``examples_one_job.py path/01_hello.py -- path/02_p2p.py --length 4 -- ...``.

A job's ranks pay for starting Python and importing torch once instead of once per script
(about two CPU-seconds a rank on a 2-core machine; docs/contributing/tests.md). Between two
scripts every rank waits at a barrier and the root prints ``### <script's file name>`` so that the
test can cut the job's output into each script's own: the examples print on the root only.
"""

from __future__ import annotations

import itertools
import runpy
import sys
from pathlib import Path

from mpi4py import MPI

MARK = "### "


def main() -> None:
    world = MPI.COMM_WORLD
    for is_separator, words in itertools.groupby(sys.argv[1:], lambda word: word == "--"):
        if is_separator:
            continue
        sys.argv = list(words)  # the script's path, then its own flags
        world.Barrier()
        if world.rank == 0:
            print(f"{MARK}{Path(sys.argv[0]).name}", flush=True)
        runpy.run_path(sys.argv[0], run_name="__main__")
        sys.stdout.flush()
    world.Barrier()


if __name__ == "__main__":
    main()
