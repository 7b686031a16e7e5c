"""What the mpi4py backend keeps per tensor (mpi_sgd/comm/backends/bufplan.py) never goes stale: a
tensor whose memory moves, grows or shrinks in place, that starts requiring grad, or that dies,
is worked out afresh. Every sum is checked against the exact one (small integers, any order)."""

from __future__ import annotations

import gc

import pytest
import torch

from mpi_sgd.comm import CommError
from mpi_sgd.comm.backends import bufplan

pytestmark = pytest.mark.mpi


def rank_sum(comm) -> float:
    return comm.size * (comm.size + 1) / 2  # each rank contributes rank + 1


def test_one_plan_per_tensor_reused_across_calls(mpicomm):
    t = torch.zeros(8)
    mpicomm.allreduce(t)
    kept = bufplan.plan(t)
    assert kept is not None and bufplan.plan(t) is kept
    for _ in range(3):
        t.fill_(mpicomm.rank + 1)
        mpicomm.allreduce(t)
        assert t.tolist() == [rank_sum(mpicomm)] * 8
    assert bufplan.plan(t) is kept


def test_memory_that_grows_moves_or_shrinks_in_place_is_seen(mpicomm):
    t = torch.full((1000,), float(mpicomm.rank + 1))
    mpicomm.allreduce(t)
    assert torch.all(t == rank_sum(mpicomm))

    t.resize_(3)  # the same memory, fewer elements: a stale plan would reduce all 1000
    beyond = torch.empty(0).set_(t.untyped_storage(), 3, (997,))
    beyond.fill_(100.0 + mpicomm.rank)
    t.fill_(mpicomm.rank + 1)
    mpicomm.allreduce(t)
    assert t.tolist() == [rank_sum(mpicomm)] * 3
    assert torch.all(beyond == 100.0 + mpicomm.rank), "the allreduce wrote past the resized tensor"

    t.resize_(5000)  # more than the storage holds: new memory
    t.fill_(mpicomm.rank + 1)
    mpicomm.allreduce(t, "max")
    assert torch.all(t == mpicomm.size) and t.numel() == 5000

    # Another tensor's memory of the same length (the old memory kept alive, so that a stale plan
    # would quietly reduce it instead of this).
    old = torch.empty(0).set_(t.untyped_storage(), 0, (5000,))
    t.set_(torch.full((5000,), float(mpicomm.rank + 1)))
    mpicomm.allreduce(t)
    assert torch.all(t == rank_sum(mpicomm)) and torch.all(old == mpicomm.size)


def test_a_tensor_that_starts_requiring_grad_is_refused(mpicomm):
    t = torch.zeros(3)
    mpicomm.allreduce(t)
    t.requires_grad_(True)
    with pytest.raises(CommError, match="requires grad.*detach"):
        mpicomm.allreduce(t)
    with pytest.raises(CommError, match="requires grad.*detach"):
        mpicomm.broadcast(t)


def test_a_tensor_transposed_or_retyped_in_place_is_seen(mpicomm):
    t = torch.arange(6.0).view(2, 3) + mpicomm.rank
    mpicomm.allreduce(t)
    t.t_()  # the same memory, now in another order: sent as the plan had it, it would be wrong
    with pytest.raises(CommError, match="contiguous"):
        mpicomm.allreduce(t)
    t.t_()
    t.data = t.view(torch.int32)  # the same bytes as another dtype: a sum of int32, not of floats
    t.fill_(-(mpicomm.rank + 1))  # as float32 bits these are NaNs: a stale plan's sum is no integer
    mpicomm.allreduce(t)
    assert bufplan.plan(t).dtype is torch.int32 and torch.all(t == -rank_sum(mpicomm))


def test_a_dead_tensors_plan_goes_with_it(mpicomm):
    gc.collect()
    before = bufplan.kept()
    t = torch.zeros(16)
    mpicomm.allreduce(t)
    assert bufplan.kept() == before + 1
    del t
    assert bufplan.kept() == before
    # Tensors made and dropped in a loop, as temporaries are, leave nothing behind and may be given
    # a dead one's id: each is worked out afresh (its own length, its own dtype).
    for n, dtype in [(4, torch.float32), (4, torch.int32), (6, torch.float64), (4, torch.float32)] * 3:
        x = torch.full((n,), mpicomm.rank + 1, dtype=dtype)
        mpicomm.allreduce(x)
        assert x.tolist() == [rank_sum(mpicomm)] * n and x.dtype == dtype
        del x
    assert bufplan.kept() == before


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.bfloat16])
def test_every_op_on_one_tensor(mpicomm, dtype):
    """One tensor, each op in turn: the op kept for one is never used for another."""
    r, size = mpicomm.rank, mpicomm.size
    want = {"sum": rank_sum(mpicomm), "max": size, "min": 1, "prod": float(torch.arange(1, size + 1).prod())}
    t = torch.empty(5, dtype=dtype)
    for op in ["sum", "max", "min", "prod", "sum", "min"]:
        t.fill_(r + 1)
        mpicomm.allreduce(t, op)
        assert t.tolist() == [want[op]] * 5, (op, dtype)
        req = mpicomm.iallreduce(t.fill_(r + 1), op)
        req.wait()
        assert t.tolist() == [want[op]] * 5, ("i" + op, dtype)
    t.fill_(r + 1)
    mpicomm.broadcast(t, root=size - 1)
    assert t.tolist() == [size] * 5


def test_through_what_init_gives_a_script(initialised):
    """The per-call check and the watchdog in front: the same sums, the same refusals."""
    t = torch.zeros(300)
    for _ in range(2):
        t.fill_(initialised.rank + 1)
        initialised.allreduce(t)
        assert torch.all(t == rank_sum(initialised))
    t.resize_(2)
    t.fill_(initialised.rank + 1)
    initialised.allreduce(t)
    assert t.tolist() == [rank_sum(initialised)] * 2


@pytest.mark.parametrize("n", [16, 5000])  # below and above the shared all-reduce's smallest buffer
def test_shared_and_ordinary_buffers_each_take_their_path_every_time(n):
    """A kept plan remembers where a tensor lies; a tensor moved into a shared window (or out of
    one) is looked up again, and every rank sends each buffer down the same path."""
    from mpi4py import MPI

    from mpi_sgd.comm.backends.mpi import MPIComm
    from mpi_sgd.comm.shm.allreduce import MIN_BYTES

    comm = MPIComm(MPI.COMM_WORLD.Dup())
    shared, plain = comm.alloc_shared(n), torch.zeros(n)
    takes_shared = comm.size > 1 and n * 4 >= MIN_BYTES
    moved = torch.zeros(n)
    for buf, via_window in [(shared, takes_shared), (plain, False)] * 2 + [(shared[: n // 2], takes_shared)]:
        buf.fill_(comm.rank + 1)
        before = comm._shm.seq
        comm.allreduce(buf)
        assert torch.all(buf == rank_sum(comm))
        assert (comm._shm.seq > before) == (via_window and buf.nbytes >= MIN_BYTES), buf.nbytes
    for target, via_window in [(shared, takes_shared), (torch.zeros(n), False), (shared, takes_shared)]:
        moved.set_(target)  # the same tensor object, now in (or out of) the window
        moved.fill_(comm.rank + 1)
        before = comm._shm.seq
        req = comm.iallreduce(moved)
        req.wait()
        assert torch.all(moved == rank_sum(comm)) and (comm._shm.seq > before) == via_window
