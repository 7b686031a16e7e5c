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


# Rounds of what a notebook or a sweep does; after a first round (MPI and torch open some files once,
# for good), the process's open files must stay as many. The first torch communicator in a process
# owns torch's default group and destroys it on close(), every group made after it with it.
CLOSE_LOOP = """
import os, sys, torch, torch.distributed as dist
from mpi_sgd.comm import init
def one_round(backend):
    comm = init(backend, abort_on_error=False, stall_timeout=30)
    x = torch.full((1000,), float(comm.rank + 1))
    comm.allreduce(x)
    assert x.tolist() == [comm.size * (comm.size + 1) / 2] * 1000
    part = comm.split(comm.rank % 2)
    y = torch.ones(3)
    part.allreduce(y)
    assert y.tolist() == [float(part.size)] * 3
    part.close()
    comm.close()
rows = []
for backend in sys.argv[1:]:
    one_round(backend)
    files = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        one_round(backend)
    rows.append(f"{backend} {files} {len(os.listdir('/proc/self/fd'))} {dist.is_initialized()}")
from mpi4py import MPI
everyone = MPI.COMM_WORLD.gather(rows)
if MPI.COMM_WORLD.rank == 0:
    for rank_rows in everyone:
        print(*rank_rows, sep=chr(10))
"""


def test_init_and_close_in_a_loop_leave_no_files_open():
    backends = ("mpi4py", "gloo", "torch-mpi4py")
    out = run_mpi(3, "-c", CLOSE_LOOP, *backends, env=ENV, timeout=180).stdout
    rows = [line.split() for line in out.splitlines()]
    assert sorted(r[0] for r in rows) == sorted(backends * 3), out  # every rank, every backend
    for backend, before, after, initialized in rows:
        assert after == before, f"{backend}: {int(after) - int(before)} files left open by three rounds"
        assert initialized == "False", f"{backend}: torch.distributed still initialised after close()"
