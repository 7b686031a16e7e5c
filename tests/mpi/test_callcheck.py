"""The per-call argument check (mpi_sgd/comm/wrappers/callcheck.py) in a real job: agreeing calls
give the same sums as the bare backend; a reduction whose ranks disagree on length or op raises
CollectiveMismatchError on every rank, naming each rank's call, before any result is returned.

Each test makes its own duplicate of COMM_WORLD: after a mismatched call MPI's state for that
communicator is undefined (MPICH may leave a partial message behind), so it is not used again."""

from __future__ import annotations

import pytest
import torch
from mpi4py import MPI

from mpi_sgd.comm import CollectiveMismatchError
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.comm.shm.sync import StalledRankError
from mpi_sgd.comm.wrappers.callcheck import CallCheck

pytestmark = pytest.mark.mpi


@pytest.fixture(params=["memory", "mpi"])
def fresh(request):
    """A new checked communicator; ``memory``: blocking calls agreed in shared memory (every rank of
    this job is on one host), ``mpi``: by a tiny all-reduce, as across hosts (a pretend node of one
    rank each)."""

    def make() -> CallCheck:
        comm = CallCheck(MPIComm(MPI.COMM_WORLD.Dup(), node_size=None if request.param == "memory" else 1))
        comm.allreduce(torch.zeros(1))  # the first reduction sets the check up
        assert (comm._here is not None) == (request.param == "memory" and comm.size > 1)
        comm.calls = 0
        return comm

    return make


@pytest.mark.parametrize("blocking", [True, False], ids=["allreduce", "iallreduce"])
@pytest.mark.parametrize("n", [5, 3000, 70000])
def test_agreeing_calls_sum_as_the_backend_does(fresh, blocking, n):
    comm = fresh()
    x = torch.arange(n, dtype=torch.float64) + comm.rank
    if blocking:
        comm.allreduce(x)
    else:
        comm.iallreduce(x).wait()
    # small integers in float64: every order of addition gives the exact sum
    want = comm.size * torch.arange(n, dtype=torch.float64) + comm.size * (comm.size - 1) / 2
    assert torch.equal(x, want)
    y = torch.full((7,), float(comm.rank))
    comm.allreduce(y, "max")
    assert torch.equal(y, torch.full((7,), float(comm.size - 1)))
    assert comm.calls == 2


@pytest.mark.parametrize("blocking", [True, False], ids=["allreduce", "iallreduce"])
def test_a_rank_with_one_more_element_is_named_on_every_rank(fresh, blocking):
    comm = fresh()
    if comm.size == 1:
        pytest.skip("needs two ranks to disagree")
    last = comm.size - 1
    x = torch.ones(6 if comm.rank == last else 5)
    with pytest.raises(CollectiveMismatchError) as caught:
        if blocking:
            comm.allreduce(x)
        else:
            comm.iallreduce(x).wait()
    text = str(caught.value)
    name = "allreduce" if blocking else "iallreduce"
    assert f"rank {last}: {name} of 6 float32, op sum (call #1)" in text
    for r in range(last):
        assert f"rank {r}: {name} of 5 float32, op sum (call #1)" in text


def test_ranks_with_different_ops_are_named(fresh):
    comm = fresh()
    if comm.size == 1:
        pytest.skip("needs two ranks to disagree")
    x = torch.ones(4)
    with pytest.raises(CollectiveMismatchError, match=r"rank 0: allreduce of 4 float32, op max"):
        comm.allreduce(x, "max" if comm.rank == 0 else "sum")


def test_each_part_of_a_split_checks_its_own_calls(fresh):
    comm = fresh()
    part = comm.split(comm.rank % 2, key=-comm.rank)  # the halves, each in reverse order
    assert isinstance(part, CallCheck)
    x = torch.ones(3)
    part.allreduce(x)
    assert torch.equal(x, torch.full((3,), float(part.size)))
    assert part.side is not None and part.side != comm.side  # the part's checks on a duplicate of the part
    if part.size > 1:
        with pytest.raises(CollectiveMismatchError, match=r"rank 0: iallreduce of 4 float32"):
            part.iallreduce(torch.ones(3 + (part.rank == 0))).wait()
    assert comm.calls == 0  # the parent saw none of the part's calls


def test_a_rank_that_never_makes_the_call_is_named_on_one_host(fresh):
    comm = fresh()
    if comm._here is None:
        pytest.skip("checked in shared memory only with two ranks or more on one host; else the watchdog names it")
    comm._here.timeout = 0.5  # the bounded wait of the shared all-reduce, shortened for the test
    last = comm.size - 1
    if comm.rank != last:
        with pytest.raises(StalledRankError, match=rf"waited 0.5 s for rank\(s\) {last} to make reduction call #1;"):
            comm.allreduce(torch.ones(3))
    MPI.COMM_WORLD.Barrier()


def test_calls_refused_after_the_check_leave_no_rank_waiting(fresh):
    """A call can pass the check and then be refused before it reaches MPI ('avg' of integers), and
    a caller may catch that and go on: then no reduction holds the ranks together between two
    checks, and a fast rank stores its next word before a slow one has read this one. That must
    count as agreement (it did agree), not leave the slow rank waiting for a word it will never see."""
    comm = fresh()
    if comm._here is not None:
        comm._here.timeout = 10
    x = torch.ones(3, dtype=torch.int64)
    for _ in range(300):
        with pytest.raises(TypeError, match="op 'avg' needs a floating dtype"):
            comm.allreduce(x, "avg")
    comm.allreduce(x)  # and the ranks still agree on what comes next
    assert torch.equal(x, torch.full((3,), comm.size)) and comm.calls == 301
