"""Step 4's ring all-reduce as the example writes it, and the library's, against MPI's all-reduce.

The example's function is taken from examples/04_ring_allreduce.py as written: its imports and
its ``ring_allreduce``, nothing the script runs. Both rings run on every communicator of the
suite, at every world size the suite runs (1, 2 and 3: the odd one gives uneven segments), for
lengths that leave segments empty or uneven, and are checked against MPI's all-reduce of the same
data and against the exact sum computed in one process.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from mpi_sgd import collectives
from tests.helpers import DTYPES, assert_close, rank_data, tolerance

pytestmark = pytest.mark.mpi

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "04_ring_allreduce.py"


def example_ring():
    """``ring_allreduce`` as examples/04_ring_allreduce.py defines it, with the imports it names."""
    tree = ast.parse(EXAMPLE.read_text())
    kept = [
        node
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        or isinstance(node, ast.FunctionDef)
        and node.name == "ring_allreduce"
    ]
    namespace: dict = {}
    exec(compile(ast.Module(kept, type_ignores=[]), str(EXAMPLE), "exec"), namespace)
    return namespace["ring_allreduce"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_both_rings_agree_with_mpis_allreduce(comm, dtype):
    ring = example_ring()
    for n in sorted({1, max(1, comm.size - 1), comm.size, 7, 1001}):
        x = torch.from_numpy(rank_data(comm.rank, n, dtype))
        by_example, by_library, by_mpi = ring(comm, x.clone()), x.clone(), comm.allreduce(x.clone())
        collectives.ring_allreduce(comm, by_library)
        for got in (by_example, by_library, by_mpi):
            assert_close(got, "sum", comm.size, n, dtype)  # each within Higham's bound of the exact sum
        if not x.dtype.is_floating_point:  # integers add exactly, in any order
            assert torch.equal(by_example, by_mpi) and torch.equal(by_library, by_mpi)
            continue
        # Why this tolerance: the rings and MPI add the same p terms in different orders, and each
        # order errs from the exact sum by at most (p+1)·u·Σ|x_r| (tests/helpers.py, after Higham
        # §4.2), so any two of them differ by at most twice that.
        bound = 2 * np.asarray(tolerance("sum", comm.size, n, dtype))
        for got in (by_example, by_library):
            assert np.all(np.abs(got.double().numpy() - by_mpi.double().numpy()) <= bound)
