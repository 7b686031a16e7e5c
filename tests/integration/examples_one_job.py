"""Run several example scripts one after another inside one MPI job, as ``__main__`` each, with
its own command line: ``examples_one_job.py 01_hello.py -- 02_p2p.py --length 4 -- ...``.

A job's ranks pay for starting Python and importing torch once instead of once per script
(about two CPU-seconds a rank on a 2-core machine; docs/contributing/tests.md). Between two
scripts every rank waits at a barrier and the root prints ``### <script>`` so that the test can
cut the job's output into each script's own: the examples print on the root only.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from mpi4py import MPI

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MARK = "### "


def scripts(argv: list[str]) -> list[list[str]]:
    """``a.py x -- b.py`` → ``[["a.py", "x"], ["b.py"]]``."""
    runs, current = [], []
    for word in argv:
        if word == "--":
            runs.append(current)
            current = []
        else:
            current.append(word)
    return [run for run in [*runs, current] if run]


def main() -> None:
    world = MPI.COMM_WORLD
    for script, *args in scripts(sys.argv[1:]):
        world.Barrier()
        if world.rank == 0:
            print(f"{MARK}{script}", flush=True)
        sys.argv = [str(EXAMPLES / script), *args]
        runpy.run_path(sys.argv[0], run_name="__main__")
        sys.stdout.flush()
    world.Barrier()


if __name__ == "__main__":
    main()
