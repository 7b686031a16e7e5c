"""probe/iprobe: receiving from whoever speaks first, on every backend that has it (gloo has not)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpi_sgd.comm import ANY_SOURCE, CommError

pytestmark = pytest.mark.mpi


def test_probe_from_any_source(comm):
    if comm.backend == "gloo":  # torch.distributed has no probe: it must say so, not hang
        with pytest.raises(CommError, match="no probe"):
            comm.iprobe()
        with pytest.raises(CommError, match="no probe"):
            comm.probe(0, 3)
        return
    # Every rank sends rank 0 a message whose length, tag and values name the sender, so a
    # mix-up in source, tag or count shows as a wrong value, not just a wrong total.
    mine = torch.full((comm.rank + 1,), float(comm.rank), dtype=torch.float64)
    sent = comm.isend(mine, 0, tag=40 + comm.rank)
    if comm.rank == 0:
        got = {}
        for _ in range(comm.size):
            status = comm.probe(ANY_SOURCE, dtype=torch.float64)
            buf = torch.empty(status.count, dtype=torch.float64)
            comm.recv(buf, status.source, status.tag)
            got[status.source] = (status.tag, buf)
        assert sorted(got) == list(range(comm.size))
        for source, (tag, buf) in got.items():
            assert tag == 40 + source
            np.testing.assert_array_equal(buf.numpy(), np.full(source + 1, float(source)))
        assert all(comm.iprobe(tag=40 + r) is None for r in range(comm.size))  # each received once
    sent.wait()
    comm.barrier()


def test_iprobe_matches_source_and_tag_and_counts_in_the_asked_dtype(comm):
    if comm.backend == "gloo":
        return
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    sent = comm.isend(np.arange(5, dtype=np.int32), right, tag=51)
    status = None
    while status is None:  # the message is on its way: poll, as a server loop does
        status = comm.iprobe(left, 51, dtype=np.int32)
    assert (status.source, status.tag, status.count) == (left, 51, 5)
    assert comm.iprobe(left, 51).count == 20  # no dtype: bytes
    assert comm.iprobe(left, 52) is None  # another tag matches nothing
    with pytest.raises(CommError, match="not a whole number"):
        comm.iprobe(left, 51, dtype=torch.float64)  # 20 bytes
    buf = np.empty(5, dtype=np.int32)
    comm.recv(buf, left, 51)
    np.testing.assert_array_equal(buf, np.arange(5))
    sent.wait()
    comm.barrier()
