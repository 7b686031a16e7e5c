"""The watchdog in a real job, around mpi4py and around torch's gloo: a rank that arrives late to
an all-reduce is named as missing, with where it said it was and every rank's stack, by the
rank(s) waiting for it; a job with no stall reports nothing; and a call made with other arguments
on one rank is named by rank 0 while the job runs. Report-only (``abort_after=0``)
so the job goes on; the messages are kept, not printed."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from mpi4py import MPI

from mpi_sgd.comm.wrappers.monitor import CHECK
from mpi_sgd.comm.wrappers.watchdog import CHECK_EVERY, Watchdog
from mpi_sgd.comm.wrappers.wrapper import CommWrapper
from tests.helpers import stall_reports


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
    texts = stall_reports(everyone, late)  # the barrier was call #1: only "slow" reports of it
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
    # 2 s: three oversubscribed ranks of an older MPICH (Debian's 4.0.2) took over 0.5 s for their
    # first all-reduce, every rank inside it; a real stall report would still show here.
    reports: list[str] = []
    wd = Watchdog(comm, timeout=2.0, abort_after=0, poll=0.05, report=reports.append)
    try:
        for _ in range(20):
            wd.allreduce(torch.ones(8))
            wd.iallreduce(torch.ones(8)).wait()
        time.sleep(0.3)  # several polls, and the mismatch check's exchanges
    finally:
        wd.close()
    assert comm.allgather_obj(reports) == [[]] * comm.size
    assert wd.seq == 40


class KeepAbort(CommWrapper):
    """Notes an abort instead of ending the job, so the test can read what came before it."""

    def __init__(self, inner):
        super().__init__(inner)
        self.aborted: list[int] = []

    def abort(self, code=1):
        self.aborted.append(code)


@pytest.mark.parametrize("comm", ["world"], indirect=True)
def test_a_call_with_other_arguments_is_caught_while_the_job_runs(comm):
    # Rank 1's 6th all-reduce passes a (2, 2) tensor where the others pass (4,): the same four floats
    # to MPI, which is content, but a different call to the program. The running CRC that rank 1
    # sends to rank 0 every CHECK_EVERY calls must differ from rank 0's, and rank 0 must name the call.
    reports: list[str] = []
    keep = KeepAbort(comm)
    wd = Watchdog(keep, timeout=30, poll=0.05, report=reports.append)
    try:
        for i in range(2 * CHECK_EVERY):
            wd.allreduce(torch.ones((2, 2) if comm.rank == 1 and i == 5 else (4,)))
        # The check's messages and the history it asks for take a few polls; under load (ranks
        # sharing cores) more than a fixed pause gives them: rank 0 waits for the named call, up
        # to 20 s, while the others wait in the barrier, their watchdogs still answering.
        deadline = time.monotonic() + (20.0 if comm.rank == 0 and comm.size > 1 else 1.0)
        while time.monotonic() < deadline and not any("at call #6" in r for r in reports):
            time.sleep(0.05)
        wd.barrier()
    finally:
        wd.close()
    if comm.size == 1:
        assert reports == [] and keep.aborted == []
        return
    if comm.rank == 0:
        assert reports == [
            "mpi_sgd watchdog: ranks made different collective calls at call #6:\n"
            "  rank 0: allreduce((4,) float32 sum), its allreduce (call #6)\n"
            "  rank 1: allreduce((2, 2) float32 sum), its allreduce (call #6)"
        ]
        assert keep.aborted == [1]
    else:
        assert reports == [] and keep.aborted == []


def test_closing_leaves_no_message_for_the_next_communicator(world):
    # A message still on its way when the watchdog closes (here the others' CHECK to rank 0, whose
    # thread polls too rarely to have read it) must be received by close(), not left behind: MPI
    # gives the freed side channel's context to the next communicator made, where a receive from
    # any source would take it as its own data (a later test's recv got '[1008, 1' as an int64).
    wd = Watchdog(world, timeout=30, abort_after=0, poll=5.0)
    try:
        wd.barrier()
        if wd.monitor is not None and world.rank != 0:
            wd.monitor._send(0, CHECK, [CHECK_EVERY, 0])  # as its thread would, at its next poll
    finally:
        wd.close()
    after = world.comm.Dup()  # in MPICH, on the context just freed
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            assert not after.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG), "a message of the closed watchdog's channel"
            time.sleep(0.01)
        after.Barrier()
    finally:
        after.Free()
