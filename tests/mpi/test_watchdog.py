"""The watchdog in a real job, around mpi4py and around torch's gloo: a rank that arrives late to
an all-reduce is named as missing, with where it said it was and every rank's stack, by the
rank(s) waiting for it; and a job with no stall reports nothing. Report-only (``abort_after=0``)
so the job goes on; the messages are kept, not printed."""

from __future__ import annotations

import socket
import time

import pytest
import torch

from mpi_sgd.comm.watchdog import Watchdog


@pytest.mark.parametrize("comm", ["world", "gloo"], indirect=True)
def test_a_late_rank_is_named_with_where_it_was(comm):
    reports: list[str] = []
    wd = Watchdog(comm, timeout=0.5, abort_after=0, poll=0.05, report=reports.append)
    late = comm.size - 1
    try:
        if comm.size == 1:  # nobody to wait for: no thread, calls pass straight through
            assert wd.monitor is None
        wd.barrier()
        buf = torch.full((4,), float(comm.rank + 1))
        if comm.rank == late and comm.size > 1:
            wd.where("napping", 7)
            time.sleep(2.0)  # four timeouts: the others must notice
        wd.allreduce(buf)
        # the sum over ranks of rank + 1, exactly: small integers in float32
        assert buf.tolist() == [comm.size * (comm.size + 1) / 2] * 4
    finally:
        wd.close()
    everyone = comm.allgather_obj(reports)
    if comm.size == 1:
        assert everyone == [[]]
        return
    assert everyone[late] == [], "the late rank never waited"
    texts = [t for r in everyone for t in r]
    assert texts, "nobody reported the stall"
    host = socket.gethostname()
    for text in texts:
        assert "allreduce (call #2) has waited" in text  # the barrier was call #1
        assert f"rank {late} missing" in text
        assert f"rank {late} on {host} last seen in napping of step 7" in text
        # every rank's Python stack, the late one's inside its nap in this test
        for r in range(comm.size):
            assert f"--- rank {r} on {host}" in text
        assert text.count("in test_a_late_rank_is_named_with_where_it_was") == comm.size


@pytest.mark.parametrize("comm", ["world", "gloo"], indirect=True)
def test_no_stall_no_report(comm):
    reports: list[str] = []
    wd = Watchdog(comm, timeout=0.5, abort_after=0, poll=0.05, report=reports.append)
    try:
        for _ in range(20):
            wd.allreduce(torch.ones(8))
            wd.iallreduce(torch.ones(8)).wait()
        time.sleep(0.3)  # several polls, and the mismatch check's exchanges
    finally:
        wd.close()
    assert comm.allgather_obj(reports) == [[]] * comm.size
    assert wd.seq == 40
