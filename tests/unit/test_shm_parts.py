"""The shared-memory all-reduce's pure parts, without processes: slicing, settings, benchmark verdicts."""

from __future__ import annotations

import pytest

from mpi_sgd.bench import shm as bench_shm
from mpi_sgd.bench import shm_report
from mpi_sgd.bench.shm import IMPLS
from mpi_sgd.comm.shm.reduce import LINE, slice_bounds
from mpi_sgd.comm.shm.settings import DEFAULT_TIMEOUT, node_size_override, timeout_setting


@pytest.mark.parametrize("itemsize", [4, 8])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_slices_cover_every_element_once_on_cache_line_edges(parts, itemsize):
    per_line = LINE // itemsize
    for n in [0, 1, 2, 3, 15, 16, 17, 31, 33, 1000, 1009, 32768, 32769, 98311]:
        bounds = [slice_bounds(n, parts, p, itemsize) for p in range(parts)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # contiguous, no overlap
        assert all(lo % per_line == 0 for lo, hi in bounds if lo < n)  # each owner starts a cache line
        lines = [-(-(hi - lo) // per_line) for lo, hi in bounds]
        assert max(lines) - min(lines) <= 1  # balanced to a line


def test_node_size_override(monkeypatch):
    monkeypatch.delenv("MPI_SGD_SHM_NODE_SIZE", raising=False)
    assert node_size_override() is None and node_size_override(3) == 3
    monkeypatch.setenv("MPI_SGD_SHM_NODE_SIZE", "2")
    assert node_size_override() == 2 and node_size_override(4) == 4  # the argument wins
    monkeypatch.setenv("MPI_SGD_SHM_NODE_SIZE", "two")
    with pytest.raises(ValueError, match="whole number of ranks, got 'two'"):
        node_size_override()
    with pytest.raises(ValueError, match="at least 1"):
        node_size_override(0)


def test_timeout_setting(monkeypatch):
    monkeypatch.delenv("MPI_SGD_SHM_TIMEOUT", raising=False)
    assert timeout_setting() == DEFAULT_TIMEOUT and timeout_setting(0.5) == 0.5
    monkeypatch.setenv("MPI_SGD_SHM_TIMEOUT", "20")
    assert timeout_setting() == 20.0 and timeout_setting(3) == 3  # the argument wins
    monkeypatch.setenv("MPI_SGD_SHM_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="number of seconds, got 'soon'"):
        timeout_setting()
    for bad in ("0", "-1", "nan"):
        monkeypatch.setenv("MPI_SGD_SHM_TIMEOUT", bad)
        with pytest.raises(ValueError, match="above 0 seconds"):
            timeout_setting()


def _row(nbytes, shared, raw, memcpy):
    return {"bytes": nbytes, "ranks": 2, "shared": shared, "raw": raw, "seam": raw, "gloo": raw, "memcpy": memcpy}


def test_bench_verdicts_name_the_worst_size():
    rows = [
        _row(4096, 1.0, 1.1, 0.1),
        _row(64 << 10, 1.0, 1.2, 0.5),
        _row(256 << 10, 1.0, 1.6, 0.5),
        _row(4 << 20, 10.0, 17.0, 8.0),
    ]
    lines = shm_report.verdicts(rows, ranks=2)
    assert lines[0].startswith("project target >= 1x MPI Allreduce from 64 KiB: met (lowest 1.20x")
    # rows without blocks (older JSON): one block each, a one-point interval that covers nothing
    assert lines[0].endswith("1.20x [0% CI 1.20-1.20, 1 blocks] at 64 KiB)")
    assert lines[1].startswith("project target >= 1.5x MPI Allreduce from 128 KiB: met (lowest 1.60x")
    # too long for 120 columns: the reason goes on a line of its own
    assert lines[2].startswith(
        "project target >= 1.8x MPI Allreduce from 2 MiB to 8 MiB: not met here\n    (lowest 1.70x"
    )
    assert all(len(part) <= 120 for line in lines for part in line.splitlines())
    assert lines[3].startswith("project target >= 1x MPI Allreduce below 64 KiB: met (lowest 1.10x")
    assert lines[4].startswith("project target within 1.3x of a one-process memcpy from 4 MiB: met (highest 1.25x")
    at_four = shm_report.verdicts(rows, ranks=4)
    assert at_four[1].startswith("project target >= 1.3x MPI Allreduce from 256 KiB: met (lowest 1.60x")
    assert len(at_four) == 4  # no 1.8x line above two ranks
    # with blocks: a size whose interval straddles the target makes the verdict inconclusive
    mixed = _row(128 << 10, 1.0, 1.5, 0.5)
    mixed["raw_blocks"], mixed["shared_blocks"] = [1.4, 1.6, 1.5, 1.7, 1.3, 1.5], [1.0] * 6
    assert (
        ": inconclusive here\n    (lowest 1.50x [95% CI 1.30-1.70, 6 blocks] at 128 KiB)"
        in shm_report.verdicts([mixed], ranks=2)[1]
    )
    assert shm_report.verdicts(rows, ranks=1) == []  # nothing to compare at one rank


def test_bench_tables_have_the_times_then_ratios_bandwidth_and_wrong_results():
    row = _row(4096, 2e-6, 4e-6, 1e-6) | {"shared_busbw_GBps": 2.048, "seam_wrong": 3, "gloo_wrong": 1}
    times, derived = (shm_report.table([row], IMPLS), shm_report.derived_table([row], IMPLS))
    header, _, cells = ([c.strip() for c in line.strip("|").split("|")] for line in times.splitlines())
    assert header == ["size", *IMPLS] and cells == ["4 KiB", "2", "4", "4", "4", "1"]
    header, _, cells = ([c.strip() for c in line.strip("|").split("|")] for line in derived.splitlines())
    ratios = ["raw/shared", "seam/shared", "gloo/shared", "shared/memcpy"]
    assert header == ["size", *ratios, "busbw GB/s (shared)", "#wrong"]
    assert cells == ["4 KiB", "2.00", "2.00", "2.00", "2.00", "2.05", "4"]  # wrong: every implementation's


@pytest.mark.parametrize("impls", [("shared", "raw", "memcpy", "gloo"), ("memcpy", "seam"), bench_shm.IMPLS])
def test_every_rank_times_the_implementations_in_the_same_order(impls):
    """Only rank 0 copies for memcpy; the others' stand-in must sit at the same place in the order,
    or rank 0 times memcpy while rank 1 waits in gloo's all-reduce (a hang, seen with memcpy before
    gloo in --impls)."""
    import torch

    class Rank:
        def __init__(self, rank):
            self.rank = rank

        def alloc_shared(self, n):
            return torch.zeros(n)

    orders = [list(bench_shm._Pools(Rank(r), impls, 1 << 16, None).calls(4096)) for r in (0, 1, 2)]
    assert orders == [list(impls)] * 3
