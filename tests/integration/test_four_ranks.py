"""The MPI tests at R = 4, in one job: ``make test`` runs tests/mpi at 1, 2 and 3 ranks, and these
files (or the part of each that four ranks add something to) once more at four.

One job, not one per file: every rank of a job pays for starting pytest, torch and the optimizer's
imports, and four ranks on two cores pay it twice over (docs/contributing/tests.md has what one job
instead of six saved).
"""

from __future__ import annotations

import pytest

from .conftest import WHOLE_FILES, polls_when_oversubscribed, run_mpi_tests

# File, then the tests of it that run at four ranks (None: all), and why the others do not.
# The torch.distributed files come first: there the backend's tests are the first in the job to
# touch torch.distributed, so the default group is started by dist.init_process_group("mpi4py")
# with no address, port, rank or size given.
FILES = {
    "test_torch_backend.py": None,
    "test_torch_ddp.py": None,
    # the equivalence, memory, timeline and header tests; the other communicators and the
    # benchmark's in-process run add nothing new at four ranks
    "test_pipeline.py": "equals_the_unsplit or other_splits or side_by_side or keeps_the_wrappers or holds_fewer "
    "or timeline_has or wrong_micro_batch",
    # flat 4 and pretend nodes 2 x 2; not nodes of one rank each (MPI between every rank, nothing
    # shared: nothing at 4 that 3 does not show), nor the trainer (at 4 on the namespace cluster,
    # test_netns_cluster.py, where one runs)
    "test_shm.py": "not alone and not trainer",
    "test_split.py": None,
    "test_sync_sgd.py": None,
    # each ZeRO stage with Adam, and the uneven units of which one is smaller than R
    "test_zero.py": "equals_plain and adam or uneven",
}
# Together: backend and DDP 52, pipeline 15, shared memory 52, split 59, trainer 16, ZeRO 6.
# Only skip: the pipeline's grid of 3 stages, which cannot divide 4 ranks.
MIN_PASSED, SKIPPED = 200, 1


def selection() -> str:
    """One ``-k`` for the whole job: each file's own selection, applied to that file alone (a
    module's name, ``test_shm.py``, is one of its tests' keywords)."""
    return " or ".join(f"({name} and ({select}))" if select else name for name, select in FILES.items())


@WHOLE_FILES
def test_the_mpi_tests_at_four_ranks():
    # Under such an MPI make test's MPI tests at three ranks (also more than two cores) still run;
    # this job of four would need a limit of many minutes to pass every time.
    if why := polls_when_oversubscribed(4):
        pytest.skip(why)
    tallies, out = run_mpi_tests(4, *FILES, select=selection())
    # every rank ran them all, and skipped none that should run (pytest exits 0 either way)
    assert len(tallies) == 4, out
    assert all(passed >= MIN_PASSED and skipped == SKIPPED for passed, skipped in tallies), (tallies, out)
