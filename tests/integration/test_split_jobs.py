"""Split communicators in whole jobs of four ranks (tests/mpi/test_split.py at R = 4 is in
test_four_ranks.py): a 2 x 2 grid whose stalled rank, in one row, is named by that row's watchdog
with the timeout the job set, not the default, and ends the job."""

from __future__ import annotations

import re
import time

from .conftest import ROOT, run_mpi

ENV = {"OMP_NUM_THREADS": "1"}

# Rows {0, 1} and {2, 3}, columns {0, 2} and {1, 3}: every rank's watchdog and fault injector come
# from init() and go with it into both parts. MPI_SGD_FAULT=3:1:stall names job rank 3, rank 1 of
# its row: it stalls when its row hears of step 1, while row rank 0 (job rank 2) waits for it in an
# all-reduce. Row 0 stays out of every call meanwhile, so the only stall is row 1's.
GRID = """
import time
import torch
from mpi_sgd.comm import init

comm = init(stall_timeout=3)
row = comm.split(comm.rank // 2, key=comm.rank)
col = comm.split(comm.rank % 2, key=comm.rank)
x = torch.ones(4)
row.allreduce(x)
col.allreduce(x)
print(f"rank {comm.rank}: row rank {row.rank} of {row.size}, column rank {col.rank} of {col.size}, "
      f"sum {x[0].item():g}, {type(row).__name__} of {type(row.inner).__name__}", flush=True)
row.where("forward", 1)
if comm.rank // 2 == 1:
    row.allreduce(x)
    print(f"rank {comm.rank}: row 1 finished its all-reduce", flush=True)
time.sleep(60)
"""


def test_a_stalled_rank_in_a_row_is_named_and_ends_the_job(tmp_path):
    script = tmp_path / "grid.py"
    script.write_text(GRID)
    start = time.monotonic()
    proc = run_mpi(4, str(script), env={**ENV, "MPI_SGD_FAULT": "3:1:stall"}, timeout=120, check=False)
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    for r, (row, col) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        # the sum over a row then a column of ones: 2 x 2; every part a FaultComm of a Watchdog
        assert f"rank {r}: row rank {row} of 2, column rank {col} of 2, sum 4, FaultComm of Watchdog" in out
    assert "mpi_sgd fault: rank 3, step 1: stall" in out  # job rank 3, though it is rank 1 of its row
    assert "finished its all-reduce" not in out
    # the row's second call, the first of step 1 (where() told the row's watchdog of the step too)
    assert re.search(r"allreduce\[0\] of step 1 \(call #2\) has waited [\d.]+ s on rank 0 \(job rank 2\)", out), out
    assert "rank 1 (job rank 3) missing (--stall-timeout 3 s)" in out  # the row's timeout is the job's
    assert "rank 1 (job rank 3) on" in out and "last seen in forward of step 1" in out
    # report at 3 s, abort 3 s after the call began; the default timeout alone would be 60 s. The
    # rest is four interpreters starting and importing torch on a shared, loaded machine.
    assert took < 50, f"the job took {took:.0f} s to end"


def fenced(text: str, after: str) -> str:
    """The first fenced block of ``text`` after the line that contains ``after``."""
    rest = text[text.index(after) :]
    start = rest.index("```")
    body = rest[rest.index("\n", start) + 1 :]
    return body[: body.index("```")]


def test_the_grid_example_of_the_docs_prints_what_they_say(tmp_path):
    page = (ROOT / "docs" / "use" / "sub-communicators.md").read_text()
    script = tmp_path / "grid_2x2.py"
    script.write_text(fenced(page, "Save this as `grid_2x2.py`"))
    out = run_mpi(4, str(script), env=ENV)
    # Each rank's print is a write of its text and one of its newline: four ranks writing at once
    # can land one line's text before another's newline, so the lines are cut where each starts.
    printed = sorted(m.strip() for m in re.findall(r"rank \d+:.*?(?=rank \d+:|\n|$)", out.stdout))
    assert printed == sorted(fenced(page, "Each rank prints one line").splitlines())
