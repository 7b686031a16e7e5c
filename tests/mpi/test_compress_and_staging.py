"""Two wrapper communicators of the GPU path, checked on the CPU against every backend.

* :class:`~mpi_sgd.comm.wrappers.compress.CompressedComm`: all-reduce in 16 bits, held to the error bound
  its module states (against the exact float64 sum), and shown to have really gone through 16 bits.
* :class:`~mpi_sgd.comm.wrappers.staged.StagedComm`: GPU tensors through host copies. With no GPU here,
  CPU tensors are made to take the staging path, so the copying in and out, shapes, roots and
  non-blocking requests are checked; the results must equal the unwrapped communicator's exactly.
"""

from __future__ import annotations

import pytest
import torch

from mpi_sgd.comm.gpu import HostBuffers
from mpi_sgd.comm.wrappers import compress, staged
from tests.helpers import rank_data

pytestmark = pytest.mark.mpi


def everyone(size, n, dtype=torch.float32):
    return torch.stack([torch.from_numpy(rank_data(r, n, "float64")).to(dtype) for r in range(size)])


@pytest.mark.parametrize("name", ("fp16", "bf16"))
@pytest.mark.parametrize("op", ("sum", "avg"))
def test_compressed_allreduce_within_its_bound(comm, name, op):
    wire = compress.DTYPES[name]
    cc = compress.CompressedComm(comm, wire)
    parts = everyone(comm.size, 1001)
    x = parts[comm.rank].clone()
    assert cc.allreduce(x, op) is x and x.dtype == torch.float32  # in place, in the caller's dtype
    exact = parts.double().sum(0) / (comm.size if op == "avg" else 1)
    bound = compress.error_bound(parts, wire) / (comm.size if op == "avg" else 1)
    bound = bound + torch.finfo(torch.float32).eps * exact.abs()  # the final value is float32
    err = (x.double() - exact).abs()
    assert (err <= bound).all(), f"worst {(err / bound).max().item():.2f}x the bound"
    assert (err > torch.finfo(torch.float32).eps * exact.abs()).any(), "no 16-bit rounding seen: not compressed?"

    y = parts[comm.rank].clone()
    cc.iallreduce(y, op).wait()
    assert torch.equal(y, x)  # the same all-reduce, non-blocking


def test_compression_leaves_integers_and_16_bit_tensors_alone(comm):
    cc = compress.CompressedComm(comm, torch.bfloat16)
    ints = torch.arange(5) + comm.rank
    cc.allreduce(ints)
    assert torch.equal(ints, torch.arange(5) * comm.size + sum(range(comm.size)))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        compress.CompressedComm(comm, torch.float64)


@pytest.fixture
def forced(monkeypatch):
    """Every tensor takes the staging path, as a GPU tensor would without a CUDA-aware MPI."""
    monkeypatch.setattr(staged, "_on_gpu", lambda buf: isinstance(buf, torch.Tensor))


def test_staging_gives_the_same_results(comm, forced):
    sc = staged.StagedComm(comm, HostBuffers(pin=False))
    size, rank, root = comm.size, comm.rank, comm.size - 1
    parts = everyone(size, 7 * size)
    x = parts[rank].clone()
    sc.allreduce(x, "avg")
    ref = parts[rank].clone()
    comm.allreduce(ref, "avg")
    assert torch.equal(x, ref)  # bitwise: the same blocking call underneath, the same algorithm
    y = parts[rank].clone()
    sc.iallreduce(y, "max").wait()
    assert torch.equal(y, parts.max(0).values)
    b = parts[rank].clone()
    sc.broadcast(b, root)
    assert torch.equal(b, parts[root])
    gathered = torch.zeros(size, 7 * size)
    sc.allgather(parts[rank].clone(), gathered)
    assert torch.equal(gathered, parts)
    got = torch.zeros(size, 7 * size)
    sc.gather(parts[rank].clone(), got if rank == root else None, root)
    if rank == root:
        assert torch.equal(got, parts)
    row = torch.zeros(7 * size)
    sc.scatter(parts.clone() if rank == root else None, row, root)
    assert torch.equal(row, parts[rank])
    mine = torch.zeros(7)
    sc.reduce_scatter(parts[rank].clone(), mine, op="sum")
    direct = torch.zeros(7)
    comm.reduce_scatter(parts[rank].clone(), direct, op="sum")
    assert torch.equal(mine, direct)
    later = torch.zeros(7)  # the non-blocking forms write back when waited on
    sc.ireduce_scatter(parts[rank].clone(), later, op="sum").wait()
    # Not bitwise: an MPI may reduce a non-blocking collective in another order than the blocking
    # one (Open MPI does). Any order of R float32 additions is within ·eps·Σ|x| of any other.
    bound = (size - 1) * torch.finfo(torch.float32).eps * parts.abs().sum(0).reshape(size, 7)[rank]
    assert ((later - direct).abs() <= bound).all(), (later - direct, bound)
    gathered_later = torch.zeros(size, 7 * size)
    sc.iallgather(parts[rank].clone(), gathered_later).wait()
    assert torch.equal(gathered_later, parts)
    r, direct = parts[rank].clone(), parts[rank].clone()
    sc.reduce(r, "sum", root)
    comm.reduce(direct, "sum", root)  # the same reduction, for the same rounding
    if rank == root:
        assert torch.equal(r, direct)


def test_staging_point_to_point(comm, forced):
    sc = staged.StagedComm(comm, HostBuffers(pin=False))
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    into = torch.zeros(5)
    reqs = [sc.irecv(into, left, tag=7), sc.isend(torch.full((5,), float(comm.rank)), right, tag=7)]
    for req in reqs:
        req.wait()
    assert torch.equal(into, torch.full((5,), float(left)))
    assert sc.backend == comm.backend and sc.size == comm.size  # the rest is the inner communicator's
