"""ZeRO-3 after ``train()`` returns: the model is an ordinary module again, on every rank.

Stage 3 frees each unit's parameters between uses (storage of size 0); reading them then read
freed memory, and ``model.state_dict()`` after training ended in a segfault. The trainer now
gathers every parameter once training is over (:meth:`mpi_sgd.zero.engine.ZeroEngine.keep_gathered`).

Reference: the plain data-parallel trainer (bucketed all-reduce) at the same world size, itself
held to one process at batch R*B by tests/mpi/test_sync_sgd.py. Tolerance as in
tests/mpi/test_zero.py, whose docstring derives it: float64, the two differ only in how MPI
associates the R terms of each gradient sum (measured at most 1.1e-16), so 1e-12.
Run at R = 1..4 (R = 4 with ``mpiexec -n 4``; ``make test`` runs R = 1, 2, 3).
"""

from __future__ import annotations

import pytest
import torch
from mpi4py import MPI

from mpi_sgd.comm.backends.mpi import MPIComm
from tests.helpers import regression_set, train_config
from tests.mpi.test_zero import build

pytestmark = pytest.mark.mpi

RTOL = ATOL = 1e-12  # see the module docstring


@pytest.fixture(scope="module")
def comm():
    return MPIComm(MPI.COMM_WORLD)


def test_state_dict_parameters_and_forward_after_training(comm):
    cfg = train_config()
    ds = regression_set(comm.size)
    plain, sharded = build(comm, cfg, ds, 0), build(comm, cfg, ds, 3)
    plain.train()
    sharded.train()
    want, got = plain.model.state_dict(), sharded.model.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=RTOL, atol=ATOL, msg=name)
    for p, q in zip(sharded.model.parameters(), plain.model.parameters(), strict=True):
        assert p.shape == q.shape and bool(torch.isfinite(p).all())
    x = ds.x[:7]
    with torch.no_grad():  # a forward of its own on each rank: no collective, parameters kept
        torch.testing.assert_close(sharded.model(x), plain.model(x), rtol=RTOL, atol=ATOL)
        sharded.model(x)
    # still there after forwards (the hooks that free a unit after its forward leave them)
    torch.testing.assert_close(sharded.model.state_dict()[name], want[name], rtol=RTOL, atol=ATOL)


def test_training_again_after_use_still_matches(comm):
    """A second train() (more steps) after the model was used frees and gathers as before."""
    cfg = train_config()
    ds = regression_set(comm.size)
    plain, sharded = build(comm, cfg, ds, 0), build(comm, cfg, ds, 3)
    for t in (plain, sharded):
        t.train()
        t.model.state_dict()
        t.cfg = type(cfg)(**{**t.cfg.__dict__, "max_steps": 2 * cfg.max_steps})
        t.train()
    for name, want in plain.model.state_dict().items():
        torch.testing.assert_close(sharded.model.state_dict()[name], want, rtol=RTOL, atol=ATOL, msg=name)
