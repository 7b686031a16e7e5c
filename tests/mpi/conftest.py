"""Every test here runs its body against each communicator (the mpi4py tests' mixin idea):
COMM_WORLD, a duplicate of it, COMM_SELF (size 1 inside any job), the size-1 LocalComm and
torch.distributed's gloo. Tests are collected in the same order on every rank, which pytest-mpi
relies on: ranks must enter the same collectives in the same order."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from mpi_sgd.comm.local import LocalComm
from mpi_sgd.comm.mpi import MPIComm

COMMS = ("world", "dup", "self", "local", "gloo")
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
        else:
            from mpi_sgd.comm.torch_dist import TorchDistComm

            _made[name] = TorchDistComm("gloo", _make("world"))
    return _made[name]


@pytest.fixture(params=COMMS)
def comm(request):
    return _make(request.param)


@pytest.fixture(scope="session")
def world():
    return _make("world")
