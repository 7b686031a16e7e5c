"""The seam's edge cases a user meets, each against a plain reference: a gradient tensor replaced
behind the strategy's back (``optimizer.zero_grad()``), channels_last parameters, tensor subclasses
and cuts of a reduce-scatter under the per-call check, 16-bit and boolean reductions, and torch's
in-place all-gather and reduce-scatter over the ``"mpi4py"`` process group."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi4py import MPI
from torch import nn

from mpi_sgd import gradsync
from mpi_sgd.comm import CollectiveMismatchError
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.comm.wrappers.callcheck import CallCheck

pytestmark = pytest.mark.mpi


def checked(node_size=None) -> CallCheck:
    return CallCheck(MPIComm(MPI.COMM_WORLD.Dup(), node_size=node_size))


def local_grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    return [p.grad.clone(memory_format=torch.contiguous_format) for p in model.parameters()]


@pytest.mark.parametrize("strategy", ["naive", "flat", "bucketed"])
@pytest.mark.parametrize("shared", [False, None], ids=["ordinary", "shared"])
def test_gradients_set_to_none_by_the_optimizer_are_still_averaged(world, strategy, shared):
    torch.manual_seed(0)  # the same model on every rank
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    sync = gradsync.make(strategy, model, world, bucket_mb=0.0001, shared=shared)  # small: several buckets
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(10 * step + world.rank))
        want = local_grads(model, x)
        for g in want:
            world.allreduce(g, "sum")
            g /= world.size
        optimizer.zero_grad()  # set_to_none=True, where sync.zero_grad() was meant
        with sync.accumulate(last=True):
            (model(x).sum() * sync.loss_scale).backward()
        sync.wait()
        for p, g in zip(model.parameters(), want, strict=True):
            torch.testing.assert_close(p.grad, g, rtol=1e-12, atol=1e-12)  # float64: to rounding
        optimizer.step()


@pytest.mark.parametrize("strategy", ["naive", "flat", "bucketed"])
def test_channels_last_parameters_are_averaged(world, strategy):
    torch.manual_seed(0)
    model = nn.Conv2d(3, 4, 3).double().to(memory_format=torch.channels_last)
    assert not model.weight.is_contiguous()
    sync = gradsync.make(strategy, model, world, shared=False)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(world.rank))
    x = x.to(memory_format=torch.channels_last)
    want = [world.allreduce(g, "sum") / world.size for g in local_grads(model, x)]
    sync.zero_grad()
    with sync.accumulate(last=True):
        (model(x).sum() * sync.loss_scale).backward()
    sync.wait()
    for p, g in zip(model.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-12, atol=1e-12)


def test_a_parameter_passes_the_check_as_a_tensor_does():
    comm = checked()
    frozen = nn.Parameter(torch.full((3,), float(comm.rank)), requires_grad=False)
    comm.allreduce(frozen)  # its count read as a tensor's, the same on every rank
    assert torch.equal(frozen.data, torch.full((3,), comm.size * (comm.size - 1) / 2))


@pytest.mark.parametrize("node_size", [None, 1], ids=["memory", "mpi"])
def test_a_reduce_scatter_cut_differently_is_named_on_every_rank(node_size):
    comm = checked(node_size)
    if comm.size == 1:
        pytest.skip("needs two ranks to disagree")
    n = 4 * comm.size
    counts = [4] * comm.size if comm.rank else [5, 3] + [4] * (comm.size - 2)  # the same total, cut otherwise
    with pytest.raises(CollectiveMismatchError) as e:
        comm.reduce_scatter(torch.ones(n), torch.zeros(counts[comm.rank]), counts)
    assert "rank 0: reduce_scatter of" in str(e.value) and f"counts {[4] * comm.size}" in str(e.value)


def test_non_blocking_reduce_scatter_of_bfloat16_is_the_blocking_ones(world):
    n = 3 * world.size
    send = torch.arange(n, dtype=torch.bfloat16) + world.rank  # small integers: exact in any order
    blocking, nonblocking = torch.zeros(3, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16)
    world.reduce_scatter(send, blocking)
    world.ireduce_scatter(send, nonblocking).wait()
    want = (torch.arange(n, dtype=torch.float32) * world.size + world.size * (world.size - 1) / 2)[
        3 * world.rank : 3 * world.rank + 3
    ]
    assert torch.equal(blocking.float(), want) and torch.equal(nonblocking.float(), want)


@pytest.mark.parametrize("op, want", [("sum", [True, True, False]), ("min", [False, True, False])])
def test_numpy_booleans_reduce_as_torch_booleans_do(world, op, want):
    mine = np.array([world.rank == 0, True, False])
    world.allreduce(mine, op)
    if world.size == 1:  # nothing else to combine with
        want = [True, True, False]
    assert mine.tolist() == want


def test_torch_in_place_all_gather_and_reduce_scatter_over_mpi4py():
    import torch.distributed as dist

    import mpi_sgd.comm.backends.torch_mpi4py  # noqa: F401 - registers the backend

    if not dist.is_initialized():
        dist.init_process_group("mpi4py")
    g = dist.new_group(backend="mpi4py")
    r, n = dist.get_rank(g), dist.get_world_size(g)
    out = torch.zeros(n * 4)
    out.view(n, 4)[r] = r + 1.0
    dist.all_gather_single(out, out.view(n, 4)[r], group=g)  # FSDP's in-place form
    assert torch.equal(out, torch.arange(1.0, n + 1).repeat_interleave(4))
    x = torch.arange(n * 4, dtype=torch.float64)
    dist.reduce_scatter_single(x[:4], x, group=g)  # the output inside the input
    assert torch.equal(x[:4], n * torch.arange(4.0 * r, 4.0 * r + 4, dtype=torch.float64))
    slots = list(torch.zeros(n, 3).unbind(0))
    slots[r] += r
    dist.all_gather(slots, slots[r], group=g)  # the input is one of the outputs
    assert torch.equal(torch.stack(slots), torch.arange(float(n)).repeat_interleave(3).view(n, 3))
