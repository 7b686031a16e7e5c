"""Every collective of the seam, on every backend, against a one-process numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpi_sgd.collectives import ring_allreduce
from mpi_sgd.comm import OPS, split_counts
from mpi_sgd.comm.polling import wait_idle
from tests.helpers import DTYPES, assert_close, rank_data, reference, tolerance

pytestmark = pytest.mark.mpi


def lengths(size: int) -> list[int]:
    # 1 and size-1 give empty ring segments; 7 and 1001 do not divide evenly by 2 or 3.
    return sorted({1, max(1, size - 1), size, 7, 1001})


def mine(comm, n, dtype, small=False) -> torch.Tensor:
    return torch.from_numpy(rank_data(comm.rank, n, dtype, small))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_allreduce(comm, op, dtype):
    for n in lengths(comm.size):
        x = mine(comm, n, dtype, small=op == "prod")
        if op == "avg" and not x.dtype.is_floating_point:
            with pytest.raises(TypeError, match="floating"):
                comm.allreduce(x, op)
            continue
        assert comm.allreduce(x, op) is x  # in place
        assert_close(x, op, comm.size, n, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ("sum", "avg", "max"))
def test_iallreduce(comm, op, dtype):
    if op == "avg" and dtype.startswith("int"):
        pytest.skip("avg needs a floating dtype (tested in test_allreduce)")
    bufs = [mine(comm, n, dtype) for n in lengths(comm.size)]
    requests = [comm.iallreduce(b, op) for b in bufs]  # several in flight at once
    for r in reversed(requests):
        r.wait()
    for b in bufs:
        assert_close(b, op, comm.size, b.numel(), dtype)


def test_allreduce_numpy(comm):
    x = rank_data(comm.rank, 1001, "float64")
    comm.allreduce(x)
    assert_close(x, "sum", comm.size, 1001, "float64")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ("sum", "avg", "max", "prod"))
def test_ring_allreduce(comm, op, dtype):
    if op == "avg" and dtype.startswith("int"):
        pytest.skip("avg needs a floating dtype")
    for n in lengths(comm.size):
        x = mine(comm, n, dtype, small=op == "prod")
        ring_allreduce(comm, x, op)
        assert_close(x, op, comm.size, n, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_from_last_rank(comm, dtype):
    root = comm.size - 1
    x = mine(comm, 7, dtype)
    comm.broadcast(x, root=root)
    np.testing.assert_array_equal(x.numpy(), rank_data(root, 7, dtype))


@pytest.mark.parametrize("op", ("sum", "min"))
def test_reduce(comm, op):
    root = comm.size // 2
    x = mine(comm, 1001, "float64")
    comm.reduce(x, op, root=root)
    if comm.rank == root:
        assert_close(x, op, comm.size, 1001, "float64")


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_allgather_scatter(comm, dtype):
    size, root = comm.size, comm.size - 1
    everyone = np.stack([rank_data(r, 5, dtype) for r in range(size)])
    got = torch.zeros(size, 5, dtype=getattr(torch, dtype))
    comm.allgather(mine(comm, 5, dtype), got)
    np.testing.assert_array_equal(got.numpy(), everyone)

    got.zero_()
    comm.gather(mine(comm, 5, dtype), got if comm.rank == root else None, root=root)
    if comm.rank == root:
        np.testing.assert_array_equal(got.numpy(), everyone)

    row = torch.zeros(5, dtype=getattr(torch, dtype))
    comm.scatter(torch.from_numpy(everyone) if comm.rank == root else None, row, root=root)
    np.testing.assert_array_equal(row.numpy(), everyone[comm.rank])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", (1, 7, 1001))
def test_reduce_scatter(comm, dtype, n):
    counts = split_counts(n, comm.size)  # uneven, and empty segments when n < size
    out = torch.zeros(counts[comm.rank], dtype=getattr(torch, dtype))
    comm.reduce_scatter(mine(comm, n, dtype), out, counts)
    start = sum(counts[: comm.rank])
    full = reference("sum", comm.size, n, dtype)
    if dtype.startswith("float"):
        np.testing.assert_allclose(
            out.numpy(), full[start : start + counts[comm.rank]], rtol=(comm.size + 1) * np.finfo(dtype).eps, atol=1e-5
        )
    else:
        np.testing.assert_array_equal(out.numpy(), full[start : start + counts[comm.rank]])


def test_point_to_point_ring(comm):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    out, into = mine(comm, 1001, "float64"), torch.zeros(1001, dtype=torch.float64)
    reqs = [comm.irecv(into, left, tag=5), comm.isend(out, right, tag=5)]
    for r in reqs:
        r.wait()
    np.testing.assert_array_equal(into.numpy(), rank_data(left, 1001, "float64"))
    # Blocking pair, ordered so it cannot deadlock: even ranks send first. Alone, a rank posts
    # a non-blocking send to itself and waits on it only after the receive: MPI may hold a send
    # until its receive is posted, so waiting first could block forever.
    token = torch.tensor([comm.rank], dtype=torch.int64)
    got = torch.zeros(1, dtype=torch.int64)
    if comm.size == 1:
        sent = comm.isend(token, 0, tag=6)
        comm.recv(got, 0, tag=6)
        sent.wait()
    elif comm.rank % 2 == 0:
        comm.send(token, right, tag=6)
        comm.recv(got, left, tag=6)
    else:
        comm.recv(got, left, tag=6)
        comm.send(token, right, tag=6)
    assert got.item() == left


def test_objects(comm):
    assert comm.bcast_obj({"from": comm.rank}, root=comm.size - 1) == {"from": comm.size - 1}
    assert comm.allgather_obj(comm.rank) == list(range(comm.size))
    gathered = comm.gather_obj(comm.rank * 10)
    assert gathered == ([r * 10 for r in range(comm.size)] if comm.is_root else None)
    comm.barrier()


def test_ibarrier_completes_once_every_rank_has_entered(comm):
    # Rank 0 enters last, after every other rank has polled its barrier and found it pending: one
    # that completed before rank 0 entered would fail here, whatever the timing.
    token = torch.zeros(1)
    if comm.rank == 0:
        for r in range(1, comm.size):
            comm.recv(token, r, tag=31)
        assert wait_idle(comm.ibarrier(), 60)
    else:
        pending = comm.ibarrier()
        assert not pending.test()
        comm.send(token, 0, tag=31)
        assert wait_idle(pending, 60)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_16_bit_floats(comm, dtype):
    """bfloat16 has no MPI datatype (float16 only in some libraries): user-defined ops add them.
    Each addition rounds to the 16-bit type, so the sum errs by at most (size-1)·u·Σ|x| beyond
    rounding the inputs themselves; (size+1)·u·Σ|x| covers both (u = eps of the 16-bit type)."""
    x = torch.from_numpy(rank_data(comm.rank, 1001, "float32")).to(dtype)
    parts = torch.stack([torch.from_numpy(rank_data(r, 1001, "float32")).to(dtype) for r in range(comm.size)])
    comm.allreduce(x, "sum")
    err = (x.double() - parts.double().sum(0)).abs()
    assert (err <= (comm.size + 1) * torch.finfo(dtype).eps * parts.double().abs().sum(0)).all()
    got = torch.zeros(comm.size, 7, dtype=dtype)
    comm.allgather(parts[comm.rank, :7].clone(), got)  # data movement: exact
    assert torch.equal(got, parts[:, :7])
    out = torch.zeros(7, dtype=dtype)
    comm.reduce_scatter(parts[comm.rank, : 7 * comm.size].clone(), out, op="max")
    assert torch.equal(out, parts[:, 7 * comm.rank : 7 * (comm.rank + 1)].max(0).values)


def check_segment(got, op, size, counts, rank, dtype):
    """Segment ``rank`` of the reduction over all ranks, within the tolerance of tests/helpers.py."""
    start, n = sum(counts[:rank]), sum(counts)
    want = reference(op, size, n, dtype)[start : start + counts[rank]]
    tol = np.broadcast_to(tolerance(op, size, n, dtype), (n,))[start : start + counts[rank]]
    assert np.all(np.abs(got.numpy().astype(np.float64) - want) <= tol), (got, want)


@pytest.mark.parametrize("dtype", ("float64", "int32"))
def test_ireduce_scatter_and_iallgather(comm, dtype):
    # Several of each in flight at once, waited on in reverse: what sharded data parallel does.
    counts = [split_counts(n, comm.size) for n in (1, 7, 1001)]
    outs = [torch.zeros(c[comm.rank], dtype=getattr(torch, dtype)) for c in counts]
    slots = [torch.zeros(comm.size, n, dtype=getattr(torch, dtype)) for n in (1, 5)]
    requests = [comm.ireduce_scatter(mine(comm, sum(c), dtype), o, c) for c, o in zip(counts, outs, strict=True)]
    requests += [comm.iallgather(mine(comm, s.shape[1], dtype), s) for s in slots]
    for r in reversed(requests):
        r.wait()
    for c, o in zip(counts, outs, strict=True):
        check_segment(o, "sum", comm.size, c, comm.rank, dtype)
    for s in slots:
        np.testing.assert_array_equal(s.numpy(), np.stack([rank_data(r, s.shape[1], dtype) for r in range(comm.size)]))
    if dtype == "float64":  # "avg" divides once the sum has arrived
        avg = torch.zeros(counts[2][comm.rank], dtype=torch.float64)
        comm.ireduce_scatter(mine(comm, 1001, dtype), avg, counts[2], "avg").wait()
        check_segment(avg, "avg", comm.size, counts[2], comm.rank, dtype)
