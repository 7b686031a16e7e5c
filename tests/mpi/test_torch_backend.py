"""The ``"mpi4py"`` torch.distributed backend, call by call, against gloo on the same inputs.

Each test makes the same ``dist.*`` call on two groups over the same ranks, one ``"mpi4py"`` and
one ``"gloo"``, from the same inputs, and compares what each wrote. Where gloo lacks the call or
the op (AVG, all_to_all of lists, reduce_scatter) the reference is computed in one process from
every rank's data (:mod:`tests.helpers`).

Tolerances. Moving data (broadcast, gathers, scatter, all-to-all, send/recv) must be exact, and so
must integer reductions and min/max. Floating sums and products: gloo and MPI may associate the
``size`` terms differently, and each order errs by at most ``(size-1)·u·Σ|x|`` (Higham §4.2, as in
:func:`tests.helpers.tolerance`); with one or two ranks there is only one order (``a + b`` is
``b + a``), so there both backends must agree bit for bit.

Run at -n 1, 2, 3 by ``make test`` (2 as ``mpirun -n 2 pytest``); at -n 4 by the integration
tests, where this module is also the first to touch torch.distributed and so starts the default
group with ``init_process_group("mpi4py")``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

import mpi_sgd.comm.backends.torch_mpi4py  # noqa: F401 - registers the backend
from tests.helpers import assert_close, rank_data, reference, tolerance

pytestmark = pytest.mark.mpi

FLOATS = ("float32", "float64")
DTYPES = ("float32", "float64", "int32", "int64")
REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
}


@pytest.fixture(scope="module")
def groups():
    if not dist.is_initialized():
        dist.init_process_group("mpi4py")  # under mpiexec: no address, port, rank or size given
        assert dist.get_backend() == "mpi4py"
    # Both over every rank; new_group gives each its own communicator, whatever the default group is.
    return {"mpi4py": dist.new_group(backend="mpi4py"), "gloo": dist.new_group(backend="gloo")}


def rank(g):
    return dist.get_rank(g)


def size(g):
    return dist.get_world_size(g)


def mine(g, n, dtype, small=False):
    return torch.from_numpy(rank_data(rank(g), n, dtype, small))


def lengths(n):
    # 1 and n-1 give empty shares somewhere; 7 and 1001 do not divide evenly by 2, 3 or 4.
    return sorted({1, max(1, n - 1), 7, 1001})


def same_or_close(got, op, n, dtype):
    """Both backends within the rounding bound of the exact reference, and bit-identical where
    only one order of operations exists (one or two ranks, integers, min/max)."""
    ours, gloo = got["mpi4py"], got["gloo"]
    n_ranks = dist.get_world_size()  # both groups span every rank
    if n_ranks <= 2 or not ours.dtype.is_floating_point or op in ("min", "max"):
        assert torch.equal(ours, gloo), f"mpi4py {ours.tolist()[:4]} != gloo {gloo.tolist()[:4]}"
    assert_close(ours, op, n_ranks, n, dtype)
    assert_close(gloo, op, n_ranks, n, dtype)


# -- reductions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_all_reduce(groups, op, dtype):
    for n in lengths(size(groups["gloo"])):
        got = {}
        for name, g in groups.items():
            x = mine(g, n, dtype, small=op == "prod")
            dist.all_reduce(x, REDUCE_OPS[op], group=g)
            got[name] = x
        same_or_close(got, op, n, dtype)


@pytest.mark.parametrize("dtype", ("int32", "int64"))
def test_all_reduce_bitwise(groups, dtype):
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        got = {}
        for name, g in groups.items():
            x = torch.from_numpy(rank_data(rank(g), 101, dtype) & 0x7F)
            dist.all_reduce(x, op, group=g)
            got[name] = x
        assert torch.equal(got["mpi4py"], got["gloo"])


@pytest.mark.parametrize("dtype", FLOATS)
def test_all_reduce_avg(groups, dtype):
    # gloo has no AVG; the one-process reference does.
    g = groups["mpi4py"]
    x = mine(g, 1001, dtype)
    dist.all_reduce(x, dist.ReduceOp.AVG, group=g)
    assert_close(x, "avg", size(g), 1001, dtype)
    with pytest.raises(TypeError, match="AVG needs a floating dtype"):
        dist.all_reduce(torch.ones(3, dtype=torch.int64), dist.ReduceOp.AVG, group=g)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_all_reduce_16_bit(groups, dtype):
    # MPI has no bfloat16 (and some libraries no float16): a user-defined op adds in the 16-bit
    # dtype, rounding once per addition, as gloo does; so at most (size-1) roundings of u·Σ|x|.
    got = {}
    for name, g in groups.items():
        x = mine(g, 1001, "float32").to(dtype)
        dist.all_reduce(x, group=g)
        got[name] = x
    n = dist.get_world_size()
    parts = torch.stack([torch.from_numpy(rank_data(r, 1001, "float32")).to(dtype).double() for r in range(n)])
    tol = (n + 1) * torch.finfo(dtype).eps * parts.abs().sum(0)
    for x in got.values():
        assert ((x.double() - parts.sum(0)).abs() <= tol).all()
    if n <= 2:
        assert torch.equal(got["mpi4py"], got["gloo"])


# The backend implements the call, so it is tested while torch still offers it; its deprecation
# notice is torch's, not something this test can act on.
@pytest.mark.filterwarnings("ignore:`torch.distributed.all_reduce_coalesced` will be deprecated:FutureWarning")
def test_all_reduce_coalesced(groups):
    got = {}
    for name, g in groups.items():
        xs = [mine(g, n, "float64") for n in (1, 7, 1001)]
        dist.all_reduce_coalesced(xs, group=g)
        got[name] = xs
    for i, n in enumerate((1, 7, 1001)):
        same_or_close({k: v[i] for k, v in got.items()}, "sum", n, "float64")


@pytest.mark.parametrize("op", ("sum", "max"))
def test_reduce(groups, op):
    got = {}
    for name, g in groups.items():
        x = mine(g, 1001, "float64")
        dist.reduce(x, dst=dist.get_global_rank(g, size(g) // 2), op=REDUCE_OPS[op], group=g)
        got[name] = x
    if rank(groups["gloo"]) == size(groups["gloo"]) // 2:
        same_or_close(got, op, 1001, "float64")
    else:  # MPI reads a non-root's buffer and leaves it alone
        assert torch.equal(got["mpi4py"], mine(groups["gloo"], 1001, "float64"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter(groups, dtype):
    # gloo has no reduce_scatter here: the reference is the one-process sum, sliced.
    g = groups["mpi4py"]
    n, block, me = size(g), 7, rank(g)
    mine_block = slice(me * block, (me + 1) * block)
    want, tol = reference("sum", n, n * block, dtype)[mine_block], tolerance("sum", n, n * block, dtype)
    out = torch.zeros(block, dtype=getattr(torch, dtype))
    dist.reduce_scatter_single(out, mine(g, n * block, dtype), group=g)
    assert (np.abs(out.numpy().astype(np.float64) - want) <= np.broadcast_to(tol, (n * block,))[mine_block]).all()
    # From a list: views of one buffer (read in place) and separate tensors (copied into one first);
    # the same MPI call on the same numbers, so bit for bit the same answer.
    data = mine(g, n * block, dtype)
    for blocks in (list(data.chunk(n)), [b.clone() for b in data.chunk(n)]):
        again = torch.zeros(block, dtype=getattr(torch, dtype))
        dist.reduce_scatter(again, blocks, group=g)
        assert torch.equal(again, out)
    if dtype in FLOATS:
        avg = torch.zeros(block, dtype=getattr(torch, dtype))
        dist.reduce_scatter_single(avg, data, op=dist.ReduceOp.AVG, group=g)
        torch.testing.assert_close(avg, out / n)  # the same sum, divided once


# -- data movement ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + ("bfloat16", "bool"))
def test_broadcast_from_last_rank(groups, dtype):
    for name, g in groups.items():
        root = size(g) - 1
        x = mine(g, 7, "float32" if dtype == "bfloat16" else "int64")
        x = (x > 0) if dtype == "bool" else x.to(getattr(torch, dtype))
        want = torch.from_numpy(rank_data(root, 7, "float32" if dtype == "bfloat16" else "int64"))
        want = (want > 0) if dtype == "bool" else want.to(getattr(torch, dtype))
        dist.broadcast(x, src=dist.get_global_rank(g, root), group=g)
        assert torch.equal(x, want), name


def test_all_gather(groups):
    g = groups["mpi4py"]
    n = size(g)
    everyone = torch.stack([torch.from_numpy(rank_data(r, 5, "float64")) for r in range(n)])
    # separately allocated outputs, anywhere in memory
    outs = [torch.zeros(5, dtype=torch.float64) for _ in range(n)]
    dist.all_gather(outs, mine(g, 5, "float64"), group=g)
    assert torch.equal(torch.stack(outs), everyone)
    # views of one buffer, listed in reverse memory order: displacements need not increase
    buf = torch.zeros(n, 5, dtype=torch.float64)
    dist.all_gather(list(buf.unbind(0))[::-1], mine(g, 5, "float64"), group=g)
    assert torch.equal(buf.flip(0), everyone)
    flat = torch.zeros(n * 5, dtype=torch.float64)
    dist.all_gather_single(flat, mine(g, 5, "float64"), group=g)
    assert torch.equal(flat.view(n, 5), everyone)
    gloo = [torch.zeros(5, dtype=torch.float64) for _ in range(n)]
    dist.all_gather(gloo, mine(g, 5, "float64"), group=groups["gloo"])
    assert torch.equal(torch.stack(gloo), everyone)


def test_all_gather_object(groups):
    g = groups["mpi4py"]
    got = [None] * size(g)
    dist.all_gather_object(got, {"rank": rank(g), "pad": "x" * rank(g) * 100}, group=g)
    assert [o["rank"] for o in got] == list(range(size(g)))


def test_gather_scatter(groups):
    for name, g in groups.items():
        n, root = size(g), size(g) - 1
        everyone = torch.stack([torch.from_numpy(rank_data(r, 5, "int64")) for r in range(n)])
        outs = [torch.zeros(5, dtype=torch.int64) for _ in range(n)] if rank(g) == root else None
        dist.gather(mine(g, 5, "int64"), outs, dst=dist.get_global_rank(g, root), group=g)
        if rank(g) == root:
            assert torch.equal(torch.stack(outs), everyone), name
        row = torch.zeros(5, dtype=torch.int64)
        ins = list(everyone.clone().unbind(0)) if rank(g) == root else None
        dist.scatter(row, ins, src=dist.get_global_rank(g, root), group=g)
        assert torch.equal(row, everyone[rank(g)]), name


def test_all_to_all(groups):
    g = groups["mpi4py"]
    n, me = size(g), rank(g)
    # Rank i sends i+j+1 rows to rank j: every pair a different size.
    sent = [torch.full((me + j + 1, 2), 10.0 * me + j) for j in range(n)]
    got = [torch.zeros(i + me + 1, 2) for i in range(n)]
    dist.all_to_all(got, sent, group=g)
    for i in range(n):
        assert torch.equal(got[i], torch.full((i + me + 1, 2), 10.0 * i + me))
    # all_to_all_single with uneven splits, against gloo
    splits_in = [me + j + 1 for j in range(n)]
    splits_out = [i + me + 1 for i in range(n)]
    results = {}
    for name, grp in groups.items():
        out = torch.zeros(sum(splits_out), 3)
        src = torch.arange(sum(splits_in) * 3, dtype=torch.float32).view(-1, 3) + 1000 * me
        dist.all_to_all_single(out, src, splits_out, splits_in, group=grp)
        results[name] = out
    assert torch.equal(results["mpi4py"], results["gloo"])


def test_send_recv(groups):
    g = groups["mpi4py"]
    n, me = size(g), rank(g)
    if n == 1:
        pytest.skip("torch refuses send/recv between a rank and itself")
    right, left = (me + 1) % n, (me - 1) % n
    into = torch.zeros(1001, dtype=torch.float64)
    reqs = [
        dist.irecv(into, dist.get_global_rank(g, left), group=g, tag=3),
        dist.isend(mine(g, 1001, "float64"), dist.get_global_rank(g, right), group=g, tag=3),
    ]
    for r in reqs:
        r.wait()
    assert torch.equal(into, torch.from_numpy(rank_data(left, 1001, "float64")))
    # from any source: the work says who sent it
    token = torch.tensor([me])
    sent = dist.isend(token, dist.get_global_rank(g, right), group=g, tag=4)
    got = torch.zeros(1, dtype=torch.int64)
    sender = dist.recv(got, group=g, tag=4)
    sent.wait()
    assert got.item() == left and sender == dist.get_global_rank(g, left)


def test_batch_isend_irecv_and_object_collectives(groups):
    g = groups["mpi4py"]
    n, me = size(g), rank(g)
    if n > 1:  # torch refuses p2p with oneself
        right, left = dist.get_global_rank(g, (me + 1) % n), dist.get_global_rank(g, (me - 1) % n)
        got = torch.zeros(4)
        ops = [dist.P2POp(dist.isend, torch.full((4,), float(me)), right, g), dist.P2POp(dist.irecv, got, left, g)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        assert torch.equal(got, torch.full((4,), float((me - 1) % n)))
    root = dist.get_global_rank(g, n - 1)
    objs = [{"from": me}]
    dist.broadcast_object_list(objs, src=root, group=g)
    assert objs == [{"from": n - 1}]
    gathered = [None] * n if me == n - 1 else None
    dist.gather_object(me * 10, gathered, dst=root, group=g)
    assert gathered == ([r * 10 for r in range(n)] if me == n - 1 else None)
    one = [None]
    dist.scatter_object_list(one, [f"to {r}" for r in range(n)] if me == n - 1 else None, src=root, group=g)
    assert one == [f"to {me}"]


def test_sub_groups(groups):
    """new_group(ranks) is an MPI sub-communicator; every rank calls new_group, members only use it."""
    n, me = dist.get_world_size(), dist.get_rank()
    evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
    mine_ranks = evens if me % 2 == 0 else odds
    ours = {tuple(r): dist.new_group(r, backend="mpi4py") for r in (evens, odds) if r}
    gloos = {tuple(r): dist.new_group(r, backend="gloo") for r in (evens, odds) if r}
    g, ref = ours[tuple(mine_ranks)], gloos[tuple(mine_ranks)]
    assert dist.get_world_size(g) == len(mine_ranks) and dist.get_rank(g) == mine_ranks.index(me)
    x, y = torch.full((5,), float(me)), torch.full((5,), float(me))
    dist.all_reduce(x, group=g)
    dist.all_reduce(y, group=ref)
    assert torch.equal(x, y) and x[0].item() == sum(mine_ranks)
    dist.broadcast(x, src=mine_ranks[-1], group=g)
    dist.barrier(group=g)


# -- non-blocking for real ----------------------------------------------------------------------
def test_async_returns_at_once_and_completes_with_mpi(groups):
    g = groups["mpi4py"]
    x = torch.ones(1001, dtype=torch.float64)
    late = size(g) > 1 and rank(g) == size(g) - 1
    dist.barrier(group=g)
    if late:
        time.sleep(0.5)  # the others start the all-reduce long before this rank joins
    t0 = time.perf_counter()
    work = dist.all_reduce(x, async_op=True, group=g)
    started = time.perf_counter() - t0
    if size(g) > 1 and not late:
        # It cannot finish before the last rank joins, and it must not wait for it to return.
        assert started < 0.25 and not work.is_completed()
    fut = work.get_future()
    assert fut.wait()[0] is x and work.is_completed()
    assert torch.equal(x, torch.full_like(x, size(g)))


def test_the_trace_notes_each_work_in_order_and_nothing_when_off(groups):
    """bench ddp's source: start, then MPI done, then settled, per work, and a "waiter" note where
    the waiter thread took the work (a blocking call's own thread hands it over after 1 ms)."""
    from mpi_sgd.comm.backends import progress

    g, engine = groups["mpi4py"], progress.engine()
    x = torch.ones(1001)
    engine.trace = notes = []
    try:
        dist.all_reduce(x, group=g)  # blocking: the caller's own thread completes it
        dist.all_reduce(x, group=g, async_op=True).wait()
    finally:
        engine.trace = None
    dist.all_reduce(x, group=g)
    assert torch.equal(x, torch.full_like(x, size(g) ** 3))
    works = {}
    for key, what, t in notes:
        works.setdefault(key, []).append((what, t))
    # Only works started while the trace was on: an earlier test's work may still be noting that
    # it settled (its future completes first, which lets its caller go on; bench ddp does the same).
    works = {key: events for key, events in works.items() if events[0][0] == "start"}
    assert len(works) == 2  # the third call, after the trace was turned off, left nothing
    for events in works.values():
        names = [w for w, _ in events]
        assert [w for w in names if w != "waiter"] == ["start", "mpi-done", "settled"], names
        times = [t for _, t in events]
        assert times == sorted(times)


def test_many_in_flight_complete_in_any_wait_order(groups):
    g = groups["mpi4py"]
    xs = [mine(g, n, "float64") for n in (1, 7, 1001, 100_000)]
    works = [dist.all_reduce(x, async_op=True, group=g) for x in xs]
    for w in reversed(works):
        w.wait()
    for x in xs:
        assert_close(x, "sum", size(g), x.numel(), "float64")


def test_a_newer_work_completes_while_an_older_one_waits_on_it(groups):
    """Every rank pre-posts a receive that its left neighbour satisfies only after an all-reduce
    has *returned* there. The progress thread blocks on the oldest work (the receive), so the
    all-reduce must be reported done by the sweeper; otherwise every rank would wait for ever."""
    g = groups["mpi4py"]
    n, me = size(g), rank(g)
    if n == 1:
        pytest.skip("needs a neighbour")
    left, right = dist.get_global_rank(g, (me - 1) % n), dist.get_global_rank(g, (me + 1) % n)
    got = torch.zeros(3)
    pending = dist.irecv(got, left, group=g, tag=11)
    x = torch.ones(3)
    dist.all_reduce(x, group=g)  # blocking: returns only once reported complete
    dist.send(torch.full((3,), float(me)), right, group=g, tag=11)
    pending.wait()
    assert torch.equal(x, torch.full((3,), float(n))) and torch.equal(got, torch.full((3,), float((me - 1) % n)))


def test_a_work_past_its_groups_timeout_fails_naming_the_call(groups):
    from datetime import timedelta

    n, me = dist.get_world_size(), dist.get_rank()
    if n == 1:
        pytest.skip("needs a second rank")
    quick = dist.new_group(backend="mpi4py", timeout=timedelta(seconds=0.3))
    got = torch.zeros(1)
    if me == 0:  # waits for a message rank 1 sends only after the timeout has passed
        work = dist.irecv(got, 1, group=quick, tag=12)
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match=r"recv on rank 0 did not complete within 0.3 s"):
            work.wait()
        assert time.perf_counter() - t0 < 5
        with pytest.raises(RuntimeError, match="recv on rank 0 did not complete"):  # and the future (DDP's)
            deadline = time.perf_counter() + 5
            while not work.get_future().done() and time.perf_counter() < deadline:
                time.sleep(0.01)
            work.get_future().wait()
    dist.barrier(group=groups["mpi4py"])
    if me == 1:  # now complete the receive, so no request is left behind
        dist.send(torch.ones(1), 0, group=quick, tag=12)
    dist.barrier(group=groups["mpi4py"])


# -- errors name the call ---------------------------------------------------------------------
def test_unsupported_calls_say_which(groups):
    g = groups["mpi4py"]
    with pytest.raises(ValueError, match="allreduce needs contiguous"):
        dist.all_reduce(torch.zeros(4, 4).t(), group=g)
    with pytest.raises(NotImplementedError, match="allreduce does not support tensors on meta"):
        dist.all_reduce(torch.zeros(3, device="meta"), group=g)
    with pytest.raises(NotImplementedError, match="allreduce does not support torch.sparse_coo"):
        dist.all_reduce(torch.zeros(3).to_sparse(), group=g)
    with pytest.raises(NotImplementedError, match="allreduce does not support reduce op"):
        dist.all_reduce(torch.zeros(3), op=dist._make_nccl_premul_sum(2.0), group=g)
    with pytest.raises(ValueError, match="all_gather needs"):
        dist.all_gather([torch.zeros(3)] * (size(g) + 1), torch.zeros(3), group=g)
    dist.barrier(group=g)  # nothing was started by the refused calls: the ranks are still in step


def test_the_mpi_library_is_asked_whether_it_is_cuda_aware(groups, monkeypatch):
    from mpi_sgd.comm import gpu

    monkeypatch.delenv("MPI_SGD_CUDA_AWARE", raising=False)
    assert gpu._loaded_mpi_libraries(), "the MPI library mpi4py loaded should be found by path"
    assert gpu.cuda_aware.__wrapped__() in (True, False)  # the query itself ran (MPICH or Open MPI's)
