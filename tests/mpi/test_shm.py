"""The shared-memory all-reduce (flat and hierarchical) against the one-process numpy reference.

Runs at every world size ``make test`` uses (1, 2, 3) and at 4 from tests/integration. Each test
runs on three node layouts of the same ranks: the real node (every rank shares memory: the flat
algorithm), pretend nodes of 2 ranks (at -n 3 that is 2 + 1, at -n 4 2 x 2: shared memory inside,
MPI between the leaders) and nodes of 1 (every rank a leader: MPI only, through the same code).

Tolerance: tests/helpers.py's bound, (R+1)·u·Σ|x_r|. The shared path adds the same R numbers as MPI
does, in another order (its own rank's first, or the leader's), and any order of R terms errs by at
most (R-1)·u·Σ|x_r| (Higham §4.2); u·|result| more covers rounding the float64 reference to float32.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

from mpi_sgd import gradsync
from mpi_sgd.comm import CollectiveMismatchError, CommError
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.comm.shm.allreduce import MIN_BYTES
from mpi_sgd.comm.shm.reduce import CHUNK_BYTES
from mpi_sgd.comm.shm.sync import StalledRankError
from tests.helpers import (
    assert_close,
    assert_same_on_every_rank,
    flat_params,
    rank_data,
    regression_set,
    tolerance,
    train_config,
)
from tests.mpi import test_sync_sgd as sgd

pytestmark = pytest.mark.mpi

LAYOUTS = {"node": None, "pairs": 2, "alone": 1}
_made: dict = {}


@pytest.fixture(params=list(LAYOUTS))
def shm(request):
    """An MPIComm whose node split is the layout's (one per layout, kept for the whole module).

    Its shared all-reduce takes every length, small ones included, which by default go to MPI's
    (see test_small_buffers_take_mpis_allreduce): the algorithm must be right at any length.
    """
    if request.param not in _made:
        comm = _made[request.param] = MPIComm(MPI.COMM_WORLD.Dup(), node_size=LAYOUTS[request.param])
        comm.alloc_shared(1)
        comm._shm.min_bytes = 0
    return _made[request.param]


def lengths(size: int, dtype: str) -> list[int]:
    item = np.dtype(dtype).itemsize
    chunk = CHUNK_BYTES // item
    # below R (empty slices), cache-line edges, primes, chunk edges, several chunks
    return sorted({1, max(1, size - 1), 15, 16, 17, 1009, chunk - 1, chunk, chunk + 1, 3 * chunk + 7})


def in_window(comm, buf) -> bool:
    return comm._shm is not None and comm._shm.mem.find(buf) is not None


def took_shared_path(comm, before: int) -> bool:
    return comm.size == 1 or comm._shm.seq > before


def everyone_equal(comm, x: torch.Tensor) -> bool:
    got = comm.comm.allgather(x.numpy().tobytes())
    return all(g == got[0] for g in got)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_allreduce_every_length(shm, op, dtype):
    for n in lengths(shm.size, dtype):
        x = shm.alloc_shared(n, getattr(torch, dtype))
        x.copy_(torch.from_numpy(rank_data(shm.rank, n, dtype)))
        before = shm._shm.seq
        assert shm.allreduce(x, op) is x  # in place
        assert took_shared_path(shm, before)
        assert_close(x, op, shm.size, n, dtype)
        # every element is computed once and copied, so replicas agree to the bit
        assert everyone_equal(shm, x), f"ranks disagree at n={n}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_16_bit_floats_against_a_float64_reference(shm, op, dtype):
    """float16 and bfloat16 buffers, summed over ranks, against float64 sums of the same 16-bit inputs.

    Tolerance. On one node the shared path sums in float32 and rounds once to the 16-bit type: half
    an ulp of the result, u16·|ref| (u16 the unit roundoff: 2^-8 bfloat16, 2^-11 float16), plus
    float32's own error, (R+1)·2^-24·Σ|x_r|, plus half float16's smallest subnormal (2^-25) where a
    result underflows. Between nodes these buffers take MPI's path, whose user-defined op rounds
    after every combination: (R+1)·u16·Σ|x_r|, the bound of tests/helpers.py with u16.
    """
    half, u16 = getattr(torch, dtype), 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    # below R, cache-line edges, and two of _reduce_half's chunks (CHUNK_BYTES of float32 each)
    for n in sorted({1, max(1, shm.size - 1), 17, 1009, CHUNK_BYTES // 4 + 1}):
        parts = [torch.from_numpy(rank_data(r, n, "float32")).to(half) for r in range(shm.size)]
        x = shm.alloc_shared(n, half)
        assert x.dtype == half and in_window(shm, x)
        x.copy_(parts[shm.rank])
        before = shm._shm.seq
        assert shm.allreduce(x, op) is x
        shared = shm.size == 1 or shm._shm.flat
        assert took_shared_path(shm, before) == shared  # 16-bit floats between nodes go to MPI
        wide = torch.stack(parts).double()
        ref = wide.sum(0) / (shm.size if op == "avg" else 1)
        mag = wide.abs().sum(0) / (shm.size if op == "avg" else 1)
        tol = u16 * ref.abs() + (shm.size + 1) * 2.0**-24 * mag + 2.0**-25 if shared else (shm.size + 1) * u16 * mag
        err = (x.double() - ref).abs()
        bad = torch.nonzero(err > tol).flatten()
        assert bad.numel() == 0, f"{op} of {n} x {dtype}: {bad.numel()} off, first {x[bad[0]]} vs {ref[bad[0]]}"
        got = shm.comm.allgather(x.view(torch.int16).numpy().tobytes())
        assert all(g == got[0] for g in got), f"ranks disagree at n={n}"


@pytest.mark.parametrize("op,dtype", [("max", "float64"), ("min", "float32"), ("prod", "float64"), ("sum", "int32")])
def test_other_ops_and_integers(shm, op, dtype):
    for n in (5, 40_000):
        x = shm.alloc_shared(n, getattr(torch, dtype))
        x.copy_(torch.from_numpy(rank_data(shm.rank, n, dtype, small=op == "prod")))
        shm.allreduce(x, op)
        assert_close(x, op, shm.size, n, dtype)


def test_iallreduce_many_in_flight_waited_out_of_order(shm):
    # 300 calls in flight exceed the in-flight slots, so starting them must advance earlier ones.
    small, large = 300 * 7, 2 * CHUNK_BYTES // 8 + 3
    a, b = shm.alloc_shared(small, torch.float64), shm.alloc_shared(large, torch.float64)
    a.copy_(torch.from_numpy(rank_data(shm.rank, small, "float64")))
    b.copy_(torch.from_numpy(rank_data(shm.rank, large, "float64")))
    requests = [shm.iallreduce(b, "avg")] + [shm.iallreduce(a[7 * i : 7 * i + 7]) for i in range(300)]
    assert all(isinstance(r.test(), bool) for r in requests[:3])  # polling never blocks
    for r in reversed(requests):
        r.wait()
    assert_close(a, "sum", shm.size, small, "float64")
    assert_close(b, "avg", shm.size, large, "float64")


def test_a_slice_of_a_shared_buffer_and_plain_buffers(shm):
    big = shm.alloc_shared(1000, torch.float64)
    part = big[100:307]
    part.copy_(torch.from_numpy(rank_data(shm.rank, 207, "float64")))
    shm.allreduce(part)
    assert_close(part, "sum", shm.size, 207, "float64")
    assert not big[:100].any() and not big[307:].any()  # nothing outside the slice touched
    plain = torch.from_numpy(rank_data(shm.rank, 1001, "float64"))
    before = shm._shm.seq
    shm.allreduce(plain)  # an ordinary tensor: MPI's all-reduce, as always
    assert shm._shm.seq == before
    assert_close(plain, "sum", shm.size, 1001, "float64")


def test_small_buffers_take_mpis_allreduce():
    comm = MPIComm(MPI.COMM_WORLD.Dup())  # the default threshold
    for n, shared in ((MIN_BYTES // 8 - 1, False), (MIN_BYTES // 8, True)):
        x = comm.alloc_shared(n, torch.float64)
        x.copy_(torch.from_numpy(rank_data(comm.rank, n, "float64")))
        before = comm._shm.seq
        comm.allreduce(x, "avg")
        assert (comm._shm.seq > before) == (shared and comm.size > 1)
        assert_close(x, "avg", comm.size, n, "float64")


def test_hierarchical_equals_flat_mpi(shm):
    # The same data through this layout's path and through MPI's own all-reduce on plain memory:
    # each is within the Higham bound of the exact sum, so they differ by at most twice that.
    n = 3 * CHUNK_BYTES // 4 + 11
    x = shm.alloc_shared(n, torch.float32)
    x.copy_(torch.from_numpy(rank_data(shm.rank, n, "float32")))
    flat = torch.from_numpy(rank_data(shm.rank, n, "float32"))
    shm.allreduce(x, "avg")
    shm.comm.Allreduce(MPI.IN_PLACE, flat.numpy())
    flat /= shm.size
    diff = (x.double() - flat.double()).abs().numpy()
    assert (diff <= 2 * tolerance("avg", shm.size, n, "float32")).all()


def test_avg_of_integers_rejected_before_communicating(shm):
    x = shm.alloc_shared(4, torch.int64)
    x.fill_(shm.rank + 1)
    with pytest.raises(TypeError, match="floating"):
        shm.allreduce(x, "avg")
    assert x.tolist() == [shm.rank + 1] * 4


def test_dead_windows_are_freed_at_the_next_allocation(shm):
    if shm.size == 1:
        pytest.skip("nothing shared at size 1")
    for _ in range(3):
        shm.alloc_shared(1000)  # dropped at once
    kept = shm.alloc_shared(10)
    count = len(shm._shm.mem._segments)
    for _ in range(5):
        shm.alloc_shared(1000)
    shm.alloc_shared(10)
    assert len(shm._shm.mem._segments) <= count + 1
    assert kept.sum() == 0


def test_gradsync_puts_flat_and_bucketed_gradients_in_the_window(shm):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)).double()
    for strategy in ("flat", "bucketed"):
        sync = gradsync.make(strategy, model, shm, bucket_mb=0.0005)
        # bucketed: [2nd layer's bias and weight, 1st layer's bias], [1st layer's weight] (solo in plain memory)
        assert len(sync.buckets) == (1 if strategy == "flat" else 2)
        assert all(in_window(shm, b.buffer) == shm.node_shared for b in sync.buckets)


@pytest.mark.parametrize("strategy", ["flat", "bucketed"])
def test_a_parameter_without_a_gradient_takes_part_as_zeros(shm, strategy):
    # A layer unused this step gets no gradient and its hook never runs; its slot in the shared
    # bucket must still be reduced (as zeros), or the ranks would reduce stale or different data.
    torch.manual_seed(0)
    used, unused = torch.nn.Linear(20, 3).double(), torch.nn.Linear(20, 3).double()
    sync = gradsync.make(strategy, torch.nn.ModuleList([used, unused]), shm, bucket_mb=0.0002)
    assert all(in_window(shm, b.buffer) == shm.node_shared for b in sync.buckets)
    x = torch.from_numpy(rank_data(shm.rank, 40, "float64")).view(2, 20)
    for layers in ([used, unused], [used]):  # a step that uses both leaves gradients in both slots
        sync.zero_grad()
        with sync.accumulate():
            (sum(layer(x).sum() for layer in layers) * sync.loss_scale).backward()
        sync.wait()
    # d/dW of sum(Wx + b) is every output row's sum of x over the batch; averaged over the ranks.
    # Float64, a few dozen terms of size ~1: rounding stays below 1e-13, a wrong slot is off by ~1.
    xs = np.stack([rank_data(r, 40, "float64").reshape(2, 20).sum(0) for r in range(shm.size)]).mean(0)
    np.testing.assert_allclose(used.weight.grad.numpy(), np.tile(xs, (3, 1)), rtol=0, atol=1e-12)
    np.testing.assert_allclose(used.bias.grad.numpy(), np.full(3, 2.0), rtol=0, atol=1e-12)
    assert not unused.weight.grad.any() and not unused.bias.grad.any()
    assert all(in_window(shm, p.grad.view(-1)) == shm.node_shared for p in sync.params)


@pytest.mark.parametrize("grad_accum", [1, 4])
@pytest.mark.parametrize("strategy", ["flat", "bucketed"])
def test_trainer_equals_one_process_with_shared_buckets(shm, strategy, grad_accum):
    """tests/mpi/test_sync_sgd.py's equivalence (same tolerance, 1e-12 in float64), on this layout;
    with 4 micro-batches the later ones accumulate into the slot the first one's gradient landed in."""
    if not shm.node_shared and shm.size > 1:
        pytest.skip("no rank shares a node here: ordinary buckets, as tests/mpi/test_sync_sgd.py runs them")
    cfg = train_config(strategy=strategy, grad_accum=grad_accum)
    ds = regression_set(shm.size)
    trainer = sgd.distributed(shm, cfg, ds)
    assert all(in_window(shm, b.buffer) == shm.node_shared for b in trainer.sync.buckets)
    trainer.train()
    got = flat_params(trainer.model)
    torch.testing.assert_close(got, sgd.reference(shm.size, cfg, ds), rtol=sgd.RTOL, atol=sgd.ATOL)
    assert_same_on_every_rank(shm, got)


def test_every_rank_maps_the_others_pages_when_a_buffer_is_made(shm):
    """A process maps a shared page on its first touch (a minor fault, the kernel mapping 16 pages
    or so at once). alloc_shared maps the other ranks' segments up front, so no all-reduce pays
    for it; touching every page of theirs afterwards faults almost never (without it: one fault
    per 64 KiB or so, here at least 256 per other rank)."""
    import resource

    buf = shm.alloc_shared(4 << 20)  # 16 MiB a rank
    seg = shm._shm.find(buf)[0]
    others = [v for q, v in enumerate(seg.views) if q != shm._shm.mem.rank]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    touched = sum(int(v.view(np.uint8)[::4096].sum()) for v in others)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert touched == 0 and faults < 32, f"{faults} page faults touching {len(others)} other segments"


def test_no_named_shared_memory_files(shm):
    # Everything this process maps from /dev/shm is unlinked (" (deleted)"): a killed job leaves nothing.
    shm.alloc_shared(1)
    with open("/proc/self/maps") as f:
        named = {p for p in (line.split(None, 5)[-1].strip() for line in f) if p.startswith("/dev/shm/")}
    assert not {p for p in named if not p.endswith("(deleted)") and os.path.basename(p).startswith("mpich")}


# -- misuse is detected on every rank, never silently reduced --------------------------------
@pytest.mark.mpi(min_size=2)
def test_different_buffers_on_different_ranks_detected():
    comm = MPIComm(MPI.COMM_WORLD.Dup())
    n = MIN_BYTES // 8
    x = comm.alloc_shared(n + comm.size, torch.float64)
    with pytest.raises(CollectiveMismatchError, match="different shared buffers"):
        comm.allreduce(x[comm.rank : comm.rank + n])  # same shape, different place: MPI would not notice
    with pytest.raises(CommError, match="earlier shared-memory all-reduce"):
        comm.allreduce(x)


@pytest.mark.mpi(min_size=2)
def test_different_sizes_in_alloc_shared_detected():
    comm = MPIComm(MPI.COMM_WORLD.Dup())
    with pytest.raises(CollectiveMismatchError, match="alloc_shared with different sizes"):
        comm.alloc_shared(10 + comm.rank)


def test_a_bad_size_in_alloc_shared_fails_on_every_rank(shm):
    # Only the last rank asks for a negative size; every rank must refuse, none may wait or map garbage.
    n = -1 if shm.rank == shm.size - 1 else 10
    with pytest.raises(CommError, match="whole number of elements"):
        shm.alloc_shared(n)
    assert shm.alloc_shared(np.int64(3)).tolist() == [0.0] * 3  # numpy integers are whole numbers too


@pytest.mark.mpi(min_size=2)
def test_a_missing_rank_is_named_after_the_timeout():
    comm = MPIComm(MPI.COMM_WORLD.Dup())
    comm.alloc_shared(1)  # sets the windows up (collective)
    comm._shm.sync.timeout = 0.5
    x = comm.alloc_shared(MIN_BYTES // 8, torch.float64)
    late, named = comm.size - 1, None
    if comm.rank != late:  # the last rank never joins
        start = time.monotonic()
        with pytest.raises(StalledRankError, match="waited 0.5 s for rank") as err:
            comm.allreduce(x)
        assert time.monotonic() - start < 5
        named = err.value.ranks
    # Each rank names the ranks it waits for directly: on one node, the late one; across nodes,
    # a rank of another node may be waiting for its own leader, who waits for the late one.
    everyone = MPI.COMM_WORLD.allgather(named)
    flat = not comm._shm.mem.multi_node
    assert all(n == [late] for r, n in enumerate(everyone) if r != late) if flat else [late] in everyone


@pytest.mark.parametrize("first", ["shared", "mpi"])
def test_a_rank_waiting_in_shared_memory_moves_its_mpi_calls_along(first):
    # One step's buckets can take both paths (a bucket below MIN_BYTES goes to MPI). A rank that
    # waits for the shared path must still drive its own MPI requests: a non-blocking all-reduce's
    # later rounds move only when each rank enters MPI (Open MPI's libnbc, MPICH's schedules), so a
    # peer that waits for that request before it joins the shared call would wait for ever.
    comm = MPIComm(MPI.COMM_WORLD.Dup())
    comm.alloc_shared(1)
    comm._shm.sync.timeout = 10.0
    n = MIN_BYTES // 8
    big = comm.alloc_shared(n, torch.float64)
    big.copy_(torch.from_numpy(rank_data(comm.rank, n, "float64")))
    small = torch.from_numpy(rank_data(comm.rank, 1001, "float64"))
    pending = comm.iallreduce(small)
    if (comm.rank == 0) == (first == "shared"):
        comm.allreduce(big)
        pending.wait()
    else:
        pending.wait()
        comm.allreduce(big)
    assert_close(small, "sum", comm.size, 1001, "float64")
    assert_close(big, "sum", comm.size, n, "float64")


def test_trainer_with_buckets_on_both_paths_equals_one_process():
    """One step's buckets split between the shared path and MPI's (the threshold set between their
    sizes), as a model whose buckets straddle MIN_BYTES has them; the order of waits that can hang
    such a mix is the test above's. Same equivalence and tolerance as tests/mpi/test_sync_sgd.py."""
    comm = MPIComm(MPI.COMM_WORLD.Dup())
    comm.alloc_shared(1)
    cfg = train_config(strategy="bucketed", bucket_mb=0.004)
    ds = regression_set(comm.size)
    trainer = sgd.distributed(comm, cfg, ds)
    sizes = sorted(sum(p.numel() * p.element_size() for p in b.params) for b in trainer.sync.buckets)
    assert len(set(sizes)) > 1, sizes  # here 512 B to 32 KiB
    comm._shm.min_bytes = sizes[-1]  # the largest shared, the smaller ones to MPI
    before = comm._shm.seq
    trainer.train()
    assert took_shared_path(comm, before)
    got = flat_params(trainer.model)
    torch.testing.assert_close(got, sgd.reference(comm.size, cfg, ds), rtol=sgd.RTOL, atol=sgd.ATOL)
    assert_same_on_every_rank(comm, got)
