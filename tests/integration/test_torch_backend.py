"""The "mpi4py" torch.distributed backend launched as users launch it: under mpiexec.

``make test`` runs tests/mpi at -n 1 and 3, and at -n 2 through ``mpirun -n 2 pytest``;
test_four_ranks.py runs the backend's MPI tests at -n 4 as well, first in their job, so that the
default group is started by ``dist.init_process_group("mpi4py")`` with no address, port, rank or
size given. Here: the example, trained over the backend.
"""

from __future__ import annotations

import re

from .conftest import EXAMPLES, run_mpi

ENV = {"OMP_NUM_THREADS": "1"}


def test_torch_ddp_example_trains_ddp_over_mpi():
    out = run_mpi(2, str(EXAMPLES / "torch_ddp_over_mpi.py"), env=ENV).stdout
    epochs = re.findall(r"epoch (\d+)  loss ([\d.]+)  accuracy ([\d.]+)  \(2 rank\(s\), mpi4py\)", out)
    assert [int(e) for e, _, _ in epochs] == [0, 1, 2], out
    losses = [float(loss) for _, loss, _ in epochs]
    assert losses[-1] < 0.7 * losses[0] and float(epochs[-1][2]) > 0.6, out  # it learns
    assert "replicas identical on all 2 ranks: True" in out


def test_torch_ddp_example_rejects_bad_flags_before_starting():
    proc = run_mpi(1, str(EXAMPLES / "torch_ddp_over_mpi.py"), "--epochs", "0", check=False, timeout=60)
    assert proc.returncode == 2 and "argument --epochs: must be >= 1, got 0" in proc.stderr


def test_the_seam_over_torch_mpi4py_and_the_pointer_from_mpi():
    # --backend torch-mpi4py: the seam's collectives through torch.distributed over the new backend,
    # at an odd size, against 03's one-process references
    out = run_mpi(3, str(EXAMPLES / "03_collectives.py"), "--backend", "torch-mpi4py", env=ENV).stdout
    assert "all collectives agree with the one-process reference" in out
    # torch's own "mpi" backend is absent from the pip wheels: the error says what to use instead
    proc = run_mpi(1, str(EXAMPLES / "03_collectives.py"), "--backend", "mpi", check=False, timeout=60)
    assert proc.returncode != 0 and "use --backend torch-mpi4py" in proc.stderr
