"""close() gives back what a communicator made (Communicator.close): a process that starts and ends
communicators in a loop, as a notebook or a sweep does, must not run out of them, while a
communicator that was only borrowed (COMM_WORLD, a test's fixture) stays usable.

MPI keeps no count of a process's communicators, so the tests count them the one way it allows:
duplicating until MPI refuses, on a duplicate whose errors return instead of aborting. They
duplicate COMM_SELF: the ids that tell communicators apart come from one pool per process,
whichever communicator a new one is made from (MPICH's), so a communicator of the world left
behind shows as one fewer, and duplicating COMM_SELF waits for no other rank. Duplicating the
world instead made each count thousands of collectives, slow wherever ranks share cores. Where
MPI's limit is large (Open MPI's, Intel MPI's) counting would take a while; above ``CAP`` the count
is skipped, saying so."""

from __future__ import annotations

import pytest
import torch
from mpi4py import MPI

from mpi_sgd.comm import init
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.comm.wrappers.watchdog import Watchdog

pytestmark = pytest.mark.mpi

CAP = 4096  # duplicates tried at most per count


def free_communicators() -> int | None:
    """How many more communicators this process may make now, or None above CAP (not collective)."""
    probe = MPI.COMM_SELF.Dup()
    probe.Set_errhandler(MPI.ERRORS_RETURN)  # a refusal raises here instead of ending the job
    made = []
    try:
        while len(made) < CAP:
            made.append(probe.Dup())
    except MPI.Exception:
        pass
    for c in made:
        c.Free()
    probe.Free()
    return None if len(made) == CAP else len(made)


def use(comm) -> None:
    """Everything that makes a communicator or window lazily, each result checked against the sum
    the ranks' values must give (small integers: exact under any order of addition)."""
    n = comm.size
    x = torch.full((1000,), float(comm.rank + 1))
    comm.allreduce(x)  # the per-call check's duplicate and window
    assert x.tolist() == [n * (n + 1) / 2] * 1000
    shared = comm.alloc_shared(5000)  # the node-shared all-reduce's windows
    shared.fill_(1.0)
    comm.allreduce(shared)
    assert shared.sum().item() == 5000.0 * n
    part = comm.split(comm.rank % 2)  # a part, with its own wrappers (a watchdog and its duplicate)
    y = torch.ones(3)
    part.allreduce(y)
    assert y.tolist() == [float(part.size)] * 3 and part.size == len(range(comm.rank % 2, n, 2))
    part.close()
    node = comm.split_type("node")  # a host's ranks (all of them here)
    assert node.allgather_obj(comm.rank) == list(range(n))
    node.close()


def round_of_init(backend: str) -> None:
    comm = init(backend, abort_on_error=False, stall_timeout=30)
    use(comm)
    comm.close()
    comm.close()  # twice is harmless


# torch's backends: closing shuts the communicator's process group down (torch-mpi4py's holds a
# duplicate of the world). Here the session's torch communicators (conftest.py) may already hold
# torch's default group, so these make later groups; a process whose init() makes the default group
# and destroys it on close, gloo's sockets included, is tests/integration/test_torch_backend.py's.
@pytest.mark.parametrize("backend", ["mpi4py", "gloo", "torch-mpi4py"])
def test_closing_what_init_made_gives_every_communicator_back(backend):
    # A first round before counting: MPI may keep a communicator of its own for good the first time
    # it is asked for something (MPICH 5 keeps one, made in the first MPIComm() of the world).
    round_of_init(backend)
    before = free_communicators()
    for _ in range(3):
        round_of_init(backend)  # under any MPI: nothing fails for having been closed
    if before is None:
        pytest.skip(f"this MPI allows over {CAP} communicators per process: too many to count here")
    after = free_communicators()
    assert after == before, f"{before - after} communicators left behind by three init()/close() rounds"


def test_a_wrapper_leaves_open_what_it_was_given():
    held = MPIComm(MPI.COMM_WORLD.Dup(), owns=True)  # its own close() would free it
    wd = Watchdog(held, timeout=30)  # a wrapper around a communicator someone else holds
    wd.close()
    assert held.comm != MPI.COMM_NULL
    x = torch.ones(2)
    held.allreduce(x)  # still usable: only the watchdog's own duplicate and thread went
    assert x.tolist() == [float(held.size)] * 2
    held.close()
    assert held.comm == MPI.COMM_NULL


def test_the_world_is_never_freed():
    comm = MPIComm()
    comm.close()
    assert MPI.COMM_WORLD != MPI.COMM_NULL and comm.comm == MPI.COMM_WORLD
    x = torch.ones(2)
    comm.allreduce(x)
    assert x.tolist() == [float(comm.size)] * 2
