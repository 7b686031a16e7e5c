"""Every test here runs its body against each communicator (the mpi4py tests' mixin idea):
COMM_WORLD, a duplicate of it, COMM_SELF (size 1 inside any job), the size-1 LocalComm,
torch.distributed's gloo, and torch.distributed over this project's "mpi4py" process group.
Tests are collected in the same order on every rank, which pytest-mpi relies on: ranks must
enter the same collectives in the same order."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.comm.backends.mpi import MPIComm

COMMS = ("world", "dup", "self", "local", "gloo", "torch-mpi4py")
_made: dict[str, object] = {}


def _make(name: str):
    if name not in _made:
        if name == "world":
            _made[name] = MPIComm(MPI.COMM_WORLD)
        elif name == "dup":
            _made[name] = MPIComm(MPI.COMM_WORLD.Dup())
        elif name == "self":
            _made[name] = MPIComm(MPI.COMM_SELF)
        elif name == "local":
            _made[name] = LocalComm()
        else:  # gloo, torch-mpi4py: each on a torch group of its own
            from mpi_sgd.comm.backends.torch_dist import TorchDistComm

            _made[name] = TorchDistComm(name, _make("world"))
    return _made[name]


@pytest.fixture(params=COMMS)
def comm(request):
    return _make(request.param)


@pytest.fixture
def mpicomm(comm):
    """``comm`` where it is the mpi4py backend: what that backend does with buffers (its checks,
    its kept plans) is its own; torch's backends validate theirs."""
    if comm.backend != "mpi4py":
        pytest.skip("buffer handling of the mpi4py backend; torch's backends validate their own")
    return comm


@pytest.fixture(scope="module")
def initialised():
    """What ``comm.init`` gives a script (the per-call check and the stall watchdog around mpi4py),
    for one module. Its watchdog is stopped when the module ends: a monitor thread left running
    would go on judging its communicator, and could end the job, while later modules run."""
    from mpi_sgd.comm import init

    comm = init("mpi4py", abort_on_error=False)
    yield comm
    comm.close()  # all that init() made, the watchdog's thread with it


@pytest.fixture(scope="session")
def world():
    return _make("world")
