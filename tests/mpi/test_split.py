"""Sub-communicators on every backend: MPI_Comm_split's rule, and each part's collectives against the
one-process reference over exactly its members.

Runs at every size ``make test`` uses (1, 3, and 2 under mpirun) and at 4 from tests/integration.
Each rank holds ``rank_data(r)`` for its rank r in the communicator being split, so the reference
of a part is the reduction over its members' data (tests/helpers.py, ``ranks=``), with that
module's tolerance: a part adds the same numbers as any all-reduce does, in an order MPI or the
torch backend chooses, and any order of m terms errs by at most (m-1)·u·Σ|x_r| (Higham §4.2).
Integers, min and max must be exact. The expected members are worked out here from the colors and
keys every rank passed, as the MPI standard words it: same color, ordered by key, then by rank."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import torch

from mpi_sgd.comm import CollectiveMismatchError, split_counts
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.comm.wrappers.checked import CheckedComm
from mpi_sgd.comm.wrappers.compress import CompressedComm, error_bound
from mpi_sgd.comm.wrappers.counting import CountingComm
from mpi_sgd.comm.wrappers.faults import Fault, FaultComm
from mpi_sgd.comm.wrappers.watchdog import Watchdog
from mpi_sgd.pipeline.grid import grid
from tests.helpers import assert_close, rank_data, reference, stall_reports

pytestmark = pytest.mark.mpi

# (color, key) of rank r in a communicator of n ranks
COLORINGS = {
    "halves": lambda r, n: (r % 2, -r),  # two parts (one at n = 1), each in reverse order; uneven at odd n
    "one_left_out": lambda r, n: (None if r == n - 1 and n > 1 else 0, 0),  # MPI_UNDEFINED; equal keys
    "uneven": lambda r, n: (0 if r == 0 else 7, n - r),  # parts of 1 and n - 1 ranks, colors 0 and 7
    "reordered": lambda r, n: (2, (2 * r) % n if n % 2 else n - 1 - r),  # one part, its ranks in a new order
}


def members(coloring, n: int, color) -> list[int]:
    """The ranks of the part of ``color``, in their order there."""
    return [r for _, r in sorted((coloring(r, n)[1], r) for r in range(n) if coloring(r, n)[0] == color)]


def check_collectives(part, ranks: list[int], me: int) -> None:
    """``part`` holds exactly ``ranks`` (in order), and its collectives reduce exactly their data."""
    assert (part.size, part.rank) == (len(ranks), ranks.index(me))
    assert part.allgather_obj(me) == ranks
    n, m = 1001, len(ranks)
    for op, dtype in (("sum", "float64"), ("avg", "float32"), ("max", "int64"), ("sum", "int32")):
        x = torch.from_numpy(rank_data(me, n, dtype))
        assert part.allreduce(x, op) is x
        assert_close(x, op, m, n, dtype, ranks=ranks)
    y = torch.from_numpy(rank_data(me, 7, "float64"))
    part.iallreduce(y, "sum").wait()
    assert_close(y, "sum", m, 7, "float64", ranks=ranks)
    root = part.size - 1
    b = torch.from_numpy(rank_data(me, 5, "int64"))
    part.broadcast(b, root=root)
    np.testing.assert_array_equal(b.numpy(), rank_data(ranks[root], 5, "int64"))
    slots = torch.zeros(m, 5, dtype=torch.int64)
    part.allgather(torch.from_numpy(rank_data(me, 5, "int64")), slots)
    np.testing.assert_array_equal(slots.numpy(), np.stack([rank_data(r, 5, "int64") for r in ranks]))
    counts = split_counts(7, m)  # uneven, and empty segments when 7 < m
    out = torch.zeros(counts[part.rank], dtype=torch.int64)
    part.reduce_scatter(torch.from_numpy(rank_data(me, 7, "int64")), out, counts)
    start = sum(counts[: part.rank])
    np.testing.assert_array_equal(out.numpy(), reference("sum", m, 7, "int64", ranks)[start : start + len(out)])
    right, left = (part.rank + 1) % m, (part.rank - 1) % m
    got = torch.zeros(1, dtype=torch.int64)
    pending = part.irecv(got, left, tag=3)
    part.send(torch.tensor([me]), right, tag=3)
    pending.wait()
    assert got.item() == ranks[left]
    part.barrier()


@pytest.mark.parametrize("coloring", list(COLORINGS))
def test_each_part_holds_its_ranks_and_reduces_their_data(comm, coloring):
    color, key = COLORINGS[coloring](comm.rank, comm.size)
    part = comm.split(color, key)
    if color is None:
        assert part is None
    else:
        assert type(part) is type(comm) and part.backend == comm.backend
        if hasattr(comm, "group"):  # a torch one: a group of its own, on its parent's device
            assert part.group is not comm.group and part.device == comm.device
        check_collectives(part, members(COLORINGS[coloring], comm.size, color), comm.rank)
    comm.barrier()  # the parent still works, beside its parts (the rank left out waits here)


def test_a_part_of_a_part(comm):
    # Halves in reverse order, then each half cut again by its own ranks' parity (the last rank of a
    # half left out): the parts hold what cutting the parent once by both rules would give.
    half = comm.split(comm.rank % 2, key=-comm.rank)
    outer = members(COLORINGS["halves"], comm.size, comm.rank % 2)
    last = half.size - 1
    color = None if half.rank == last and half.size > 2 else half.rank % 2
    quarter = half.split(color, key=half.rank)
    if color is None:
        assert quarter is None
    else:
        inner = [outer[i] for i in range(half.size) if not (i == last and half.size > 2) and i % 2 == color]
        check_collectives(quarter, inner, comm.rank)
    check_collectives(half, outer, comm.rank)  # the middle one still works


def test_node_split_holds_the_ranks_that_share_this_host(comm):
    # Every rank of these jobs runs on one host, so "node" here is every rank on the same host:
    # the host name is the independent check of MPI_COMM_TYPE_SHARED's answer.
    hosts = comm.allgather_obj(socket.gethostname())
    node = comm.split_type("node", key=-comm.rank)
    ranks = sorted((r for r in range(comm.size) if hosts[r] == hosts[comm.rank]), reverse=True)
    assert (node.local_rank, node.local_size) == (node.rank, node.size)
    check_collectives(node, ranks, comm.rank)


def test_a_bad_color_fails_on_every_rank_before_any_part_is_made(comm):
    last = comm.size - 1
    with pytest.raises(ValueError, match=f"rank {last} passed color -1"):
        comm.split(-1 if comm.rank == last else 0)
    with pytest.raises(ValueError, match="split_type needs"):
        comm.split_type("socket")
    comm.barrier()  # nobody was left inside a split


@pytest.mark.parametrize("node_size", [None, 1], ids=["flat", "pretend_nodes_of_one"])
def test_node_shared_buffers_on_a_part(world, node_size):
    # The part's shared all-reduce: windows on the part's own node split (flat), or with the parent's
    # pretend nodes of one rank kept (every rank a leader: MPI between them, through the same code).
    parent = MPIComm(world.comm.Dup(), node_size=node_size)
    part = parent.split(world.rank % 2, key=-world.rank)
    ranks = members(COLORINGS["halves"], world.size, world.rank % 2)
    assert part.node_shared == (part.size > 1 and node_size is None) and part.local_size == part.size
    n = 5000
    x = part.alloc_shared(n, torch.float64)
    part._shm.min_bytes = 0  # every length through the shared path, as tests/mpi/test_shm.py does
    x.copy_(torch.from_numpy(rank_data(world.rank, n, "float64")))
    before = part._shm.seq
    assert part.allreduce(x, "avg") is x
    assert part.size == 1 or part._shm.seq > before  # it took the shared path
    assert_close(x, "avg", part.size, n, "float64", ranks=ranks)
    y = part.alloc_shared(n, torch.float32)
    y.copy_(torch.from_numpy(rank_data(world.rank, n, "float32")))
    part.iallreduce(y, "sum").wait()
    assert_close(y, "sum", part.size, n, "float32", ranks=ranks)


def test_wrappers_hold_on_each_part(comm):
    ranks = members(COLORINGS["halves"], comm.size, comm.rank % 2)
    # Debug mode: a part whose ranks disagree refuses the call on every one of its ranks.
    checked = CheckedComm(comm).split(comm.rank % 2, key=-comm.rank)
    assert isinstance(checked, CheckedComm)
    if checked.size > 1:
        with pytest.raises(CollectiveMismatchError, match="different arguments"):
            checked.allreduce(torch.zeros(3 + (checked.rank == 0)))
    # Counting: a part counts its own bytes, its parent none of them.
    counting = CountingComm(comm)
    part = counting.split(comm.rank % 2, key=-comm.rank)
    part.allreduce(torch.ones(8, dtype=torch.float64))
    assert part.bytes["allreduce"] == 64 and counting.bytes["allreduce"] == 0
    # Compression: the part's sum in bfloat16, within compress.py's bound over the part's members.
    part = CompressedComm(comm, torch.bfloat16).split(comm.rank % 2, key=-comm.rank)
    x = torch.from_numpy(rank_data(comm.rank, 257, "float32"))
    part.allreduce(x)
    rows = torch.from_numpy(np.stack([rank_data(r, 257, "float32") for r in ranks]))
    err = (x.double() - rows.double().sum(0)).abs()
    assert bool((err <= error_bound(rows, torch.bfloat16)).all())


def test_a_fault_strikes_the_job_rank_in_whichever_part(comm):
    # The last rank of the job is rank 0 of its (reversed) half: the fault names the job's rank, so
    # its half, and only its half, sums a NaN from it.
    last = comm.size - 1
    faults = FaultComm(comm, Fault(last, 1, "nan"))
    part = faults.split(comm.rank % 2, key=-comm.rank)
    assert part.job_rank == comm.rank
    part.where("forward", 1)
    x = torch.ones(4)
    part.allreduce(x)
    assert bool(x.isnan().all()) == (comm.rank % 2 == last % 2)
    assert (faults.tampered is not None) == (comm.rank == last)  # the process's record, on its parent too


@pytest.mark.parametrize("comm", ["world", "gloo"], indirect=True)
def test_a_late_rank_in_a_part_is_named_with_the_parts_timeout(comm):
    # The watchdog's part keeps its 0.5 s timeout (not the default 60 s) and reports by the part's
    # rank and the job's: the part holds every rank in reverse order, so part rank 0 is the last job
    # rank, and it naps. Report-only (abort_after=0); the messages are kept.
    reports: list[str] = []
    wd = Watchdog(comm, timeout=0.5, abort_after=0, poll=0.05, report=reports.append)
    part = wd.split(0, key=-comm.rank)
    late = comm.size - 1
    try:
        assert isinstance(part, Watchdog) and (part.timeout, part.abort_after, part.poll) == (0.5, 0.0, 0.05)
        assert part.world_ranks == list(range(comm.size))[::-1]
        assert comm.size == 1 or part.monitor is not wd.monitor and part.monitor is not None
        part.barrier()
        if part.rank == 0 and part.size > 1:
            part.where("napping", 7)
            time.sleep(2.0)  # four timeouts
        buf = torch.full((4,), float(comm.rank + 1))
        part.allreduce(buf)
        assert buf.tolist() == [comm.size * (comm.size + 1) / 2] * 4  # small integers: exact
    finally:
        part.close()
        wd.close()
    everyone = comm.allgather_obj(reports)
    if comm.size == 1:
        assert everyone == [[]]
        return
    texts = stall_reports(everyone, late)
    for text in texts:
        assert "allreduce (call #2) has waited" in text and "(--stall-timeout 0.5 s)" in text
        assert f"rank 0 (job rank {late}) missing" in text
        assert f"rank 0 (job rank {late}) on {socket.gethostname()} last seen in napping of step 7" in text


def test_the_pipeline_grid_keeps_the_watchdog_and_the_fault(world):
    # grid() used to rebuild wrappers by type: the watchdog's timeout went back to its default and a
    # fault injector could not be rebuilt at all. Split parts keep both.
    stages = world.size if world.size % 2 else max(1, world.size // 2)
    wd = Watchdog(world, timeout=7.0, abort_after=0, poll=0.5)
    faulty = FaultComm(wd, Fault(0, 99, "raise"))
    pipe, data = grid(faulty, stages)
    try:
        for half in (pipe, data):
            assert isinstance(half, FaultComm) and half.fault == faulty.fault and half.job_rank == world.rank
            assert isinstance(half.inner, Watchdog) and half.inner.timeout == 7.0
    finally:
        for half in (pipe, data):
            half.inner.close()
        wd.close()
