"""The ring figure's record is what the ring really sends: every message against the textbook."""

from __future__ import annotations

import pytest

from mpi_sgd.figures import ring
from tests.helpers import textbook_ring

pytestmark = pytest.mark.mpi


def test_the_record_is_patarasuk_and_yuans_schedule(comm):
    rec = ring.record(comm)
    if not comm.is_root:
        assert rec is None
        return
    # Exact: the data are integers, so the record names every chunk and contributor exactly, and
    # the final buffers decode only if the ring's sums are exact (decode refuses anything else).
    without_tags = [
        {**s, "sends": [{k: v for k, v in m.items() if k != "tag"} for m in s["sends"]]} for s in rec["steps"]
    ]
    want = textbook_ring(comm.size)
    assert without_tags == want["steps"]
    assert rec["result"] == want["result"]
    assert len(ring.replay(rec)) == 2 * (comm.size - 1) + 1  # and the drawing accepts it
