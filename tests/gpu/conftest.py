"""GPU tests: run by ``make test-gpu`` on a host with CUDA; everywhere else they skip, cleanly.

``make test-gpu`` runs the single-process ones, then the MPI ones under ``mpiexec -n G`` with G the
number of GPUs (one rank per GPU). ``make test`` reaches this directory only through
``mpirun -n 2 pytest --with-mpi`` (every test under ``tests/``), where without CUDA all of them skip.
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device here (a CPU build of torch, or no GPU): run on a GPU host")
    for item in items:
        if "tests/gpu/" in item.nodeid.replace("\\", "/"):
            item.add_marker(skip)
