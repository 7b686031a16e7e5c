"""The fault matrix (``mpi-sgd faults``) in the test suite: every way of breaking a two-rank
training job ends it with the right status, a message naming the cause (and, for an injected
fault, the faulty rank: a SIGKILLed one through the start line's PIDs), and within
its bound. One test per case, so a hang or a slow case is named on its own; the stall timeout is
3 s to keep the stall cases short."""

from __future__ import annotations

import pytest

from mpi_sgd import faultmatrix

from .conftest import EXAMPLES, ROOT


@pytest.mark.parametrize("case", faultmatrix.CASES, ids=[c.name for c in faultmatrix.CASES])
def test_fault_case(case):
    outcome = faultmatrix.run_case(case, str(EXAMPLES / "sync_sgd.py"), stall_timeout=3.0, cwd=str(ROOT))
    assert outcome.passed, f"{faultmatrix.table([outcome])}\n{outcome.message}\n{outcome.tail}"
    if case.blame is not None:  # an injected fault: its row names the faulty rank (judge checks it too)
        assert f"rank {case.blame}" in outcome.message, outcome.message
