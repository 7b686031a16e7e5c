"""Data and references shared by the tests: what every rank holds, and what the answer must be."""

from __future__ import annotations

import numpy as np
import torch

from mpi_sgd import data, launch
from mpi_sgd.config import TrainConfig
from mpi_sgd.launch import placement

DTYPES = ("float32", "float64", "int32", "int64")
# The equivalence tests' runs (tests/mpi/test_sync_sgd.py, test_zero.py): samples per rank per
# step, and optimizer steps.
B, STEPS = 8, 6


def rank_data(rank: int, n: int, dtype: str, small: bool = False) -> np.ndarray:
    """Deterministic data of one rank, so that every rank can compute every other rank's share."""
    rng = np.random.default_rng(1000 + rank)
    if np.dtype(dtype).kind == "f":
        return (rng.uniform(0.5, 1.5, n) if small else rng.standard_normal(n)).astype(dtype)
    return rng.integers(1, 3, n).astype(dtype) if small else rng.integers(-50, 50, n).astype(dtype)


def reference(op: str, size: int, n: int, dtype: str, ranks=None) -> np.ndarray:
    """The reduction over all ranks, computed in one process in float64 (or exact integers).

    ``ranks``: the reduction over the data of these ranks only (a sub-communicator's members, named
    by the rank whose data each holds); ``size`` is then their number."""
    ranks = range(size) if ranks is None else ranks
    parts = np.stack([rank_data(r, n, dtype, small=op == "prod") for r in ranks])
    wide = parts.astype(np.float64) if parts.dtype.kind == "f" else parts
    return {
        "sum": lambda: wide.sum(0),
        "avg": lambda: wide.sum(0) / size,
        "min": lambda: wide.min(0),
        "max": lambda: wide.max(0),
        "prod": lambda: wide.prod(0),
    }[op]()


def tolerance(op: str, size: int, n: int, dtype: str, ranks=None) -> np.ndarray | float:
    """Why this tolerance: MPI, gloo and the ring add the same numbers in different orders. Any
    order of summing ``size`` terms errs by at most (size-1)·u·Σ|x_r| (Higham, *Accuracy and
    Stability*, §4.2), u the unit roundoff of the dtype; avg divides that by size, products
    compound the same way on |Π x_r|. Integers and min/max must be exact."""
    if np.dtype(dtype).kind != "f" or op in ("min", "max"):
        return 0.0
    u = np.finfo(dtype).eps
    ranks = range(size) if ranks is None else ranks
    parts = np.stack([rank_data(r, n, dtype, small=op == "prod") for r in ranks]).astype(np.float64)
    # u·|result| covers rounding the exact float64 reference to the dtype itself.
    if op == "prod":
        mag = np.abs(parts).prod(0)
        return (size + 1) * u * mag
    mag = np.abs(parts).sum(0) / (size if op == "avg" else 1)
    return (size + 1) * u * mag


def assert_close(got, op: str, size: int, n: int, dtype: str, ranks=None) -> None:
    got = np.asarray(got, dtype=np.float64 if np.dtype(dtype).kind == "f" else None).reshape(-1)
    ref = reference(op, size, n, dtype, ranks)
    tol = tolerance(op, size, n, dtype, ranks)
    err = np.abs(got - ref)
    bad = np.nonzero(err > tol)[0]
    assert bad.size == 0, (
        f"{op} over {size} ranks, {n} x {dtype}: {bad.size} element(s) off, first at {bad[0]}: "
        f"got {got[bad[0]]!r}, want {ref[bad[0]]!r} (tolerance {np.broadcast_to(tol, err.shape)[bad[0]]:.3g})"
    )


def prints_usage_errors() -> bool:
    """Whether this process is the one that prints usage errors: rank 0 of the job it runs in.

    Under ``mpirun -n 2 pytest --with-mpi`` every rank runs the unit tests too, and a bad command
    line is reported by rank 0 alone (``mpi_sgd.args``): other ranks exit 2 and print nothing.
    """
    return placement().rank == 0


def standalone_env() -> dict[str, str]:
    """This environment without the enclosing MPI job's variables: a script started from a test
    then runs as a job of its own (rank 0 of 1), even under ``mpirun -n 2 pytest --with-mpi``; the
    chosen MPI's own start switches (Open MPI as root, oversubscribed) stay, or it starts nothing."""
    return launch.standalone_env()


def train_config(**kw) -> TrainConfig:
    """What the equivalence tests train: ffnet on float64 regression, STEPS steps of batch B per
    rank, small buckets (several per step); ``kw`` changes what a test is about."""
    base = dict(
        model="ffnet",
        dataset="toy",
        batch_size=B,
        lr=0.05,
        momentum=0.9,
        dtype="float64",
        max_steps=STEPS,
        epochs=100,
        progress=False,
        bucket_mb=0.02,
        seed=3,
    )
    base.update(kw)
    return TrainConfig(**base)


def regression_set(size: int) -> data.Dataset:
    """3 global batches per epoch at ``size`` ranks, so STEPS steps cross an epoch boundary (a reshuffle)."""
    return data.toy_regression(num_samples=3 * size * B + 5, input_size=12, seed=1).to(torch.float64)


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def stall_reports(everyone: list[list[str]], late: int) -> list[str]:
    """Of every rank's watchdog reports (``everyone``, by rank), those that name a rank as missing,
    after checking the rest. On a loaded, oversubscribed host a call can outlast the timeout with
    every rank inside it (a barrier, or an all-reduce once the late rank has come): that is the
    "slow network" report, true and harmless, so any rank may make it; the ``late`` rank, which
    waited for nobody, may make no other, save one: there a peer whose watchdog thread got no CPU
    for the answer's few seconds (ranks spinning inside MPI on fewer cores, as with Debian's MPICH
    over UCX at four ranks on two) is named missing for its silence alone, "did not answer", and
    that is all such a report may say. Returns the others' reports that name someone missing."""
    slow = "every rank has started this call"
    assert all(slow in t or _silence_only(t) for t in everyone[late]), everyone[late]
    texts = [t for r, mine in enumerate(everyone) if r != late for t in mine if slow not in t]
    assert texts, "nobody reported the stall"
    return texts


def _silence_only(text: str) -> bool:
    """A stall report whose every missing rank is missing only because it did not answer."""
    head, *rest = text.splitlines()
    notes = [line for line in rest if line.startswith("  rank ")]  # one per rank named, missing or not
    return " missing" in head and "made a different call" not in head and all("did not answer" in n for n in notes)


def assert_same_on_every_rank(comm, t: torch.Tensor) -> None:
    everyone = torch.zeros(comm.size, t.numel(), dtype=t.dtype)
    comm.allgather(t.contiguous(), everyone)
    for r in range(comm.size):
        # Every rank applies the same update to the same averaged gradient: bit-identical.
        assert torch.equal(everyone[r], everyone[0]), f"rank {r} drifted from rank 0"


def textbook_ring(p: int) -> dict:
    """Patarasuk & Yuan's schedule written out: in reduce-scatter step s rank r sends chunk r-s
    holding ranks r, r-1, ..., r-s; in all-gather step s it sends the complete chunk r+1-s."""
    steps = []
    for s in range(p - 1):
        sends = [
            {"rank": r, "dest": (r + 1) % p, "chunk": (r - s) % p, "holds": sorted({(r - j) % p for j in range(s + 1)})}
            for r in range(p)
        ]
        steps.append({"phase": "reduce-scatter", "step": s, "sends": sends})
    for s in range(p - 1):
        sends = [{"rank": r, "dest": (r + 1) % p, "chunk": (r + 1 - s) % p, "holds": list(range(p))} for r in range(p)]
        steps.append({"phase": "all-gather", "step": s, "sends": sends})
    return {"ranks": p, "steps": steps, "result": [[list(range(p))] * p for _ in range(p)]}
