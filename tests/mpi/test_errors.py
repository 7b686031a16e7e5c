"""Bad input fails clearly, before any communication, on every rank; debug mode catches ranks
that disagree. Nothing here may hang: every rank raises the same error at the same point."""

from __future__ import annotations

import pytest
import torch

from mpi_sgd.comm import CollectiveMismatchError, CommError, init
from mpi_sgd.comm.backends.mpi import MPIComm
from mpi_sgd.comm.wrappers.checked import CheckedComm
from mpi_sgd.comm.wrappers.watchdog import Watchdog

pytestmark = pytest.mark.mpi


def test_non_contiguous_rejected(mpicomm):
    x = torch.zeros(4, 6)[:, ::2]
    with pytest.raises(CommError, match="not contiguous.*contiguous"):
        mpicomm.allreduce(x)


def test_a_dtype_mpi_cannot_carry_is_rejected(mpicomm):
    # bfloat16 is carried (test_collectives.py::test_16_bit_floats); 8-bit floats are not
    with pytest.raises(CommError, match="float8_e4m3fn has no MPI datatype.*convert"):
        mpicomm.allreduce(torch.zeros(3, dtype=torch.float8_e4m3fn))


def test_requires_grad_rejected(mpicomm):
    with pytest.raises(CommError, match="requires grad.*detach"):
        mpicomm.broadcast(torch.zeros(3, requires_grad=True))


def test_other_device_rejected(mpicomm):
    with pytest.raises(CommError, match="not CUDA-aware.*nccl"):
        mpicomm.allreduce(torch.zeros(3, device="meta"))


def test_unknown_op(comm):
    with pytest.raises(ValueError, match="unknown reduction op 'mean'"):
        comm.allreduce(torch.zeros(3), "mean")


def test_buffer_untouched_on_int_avg(comm):
    x = torch.full((3,), comm.rank + 1, dtype=torch.int32)
    with pytest.raises(TypeError):
        comm.allreduce(x, "avg")
    assert x.tolist() == [comm.rank + 1] * 3


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "call",
    [
        ("allreduce", lambda c: c.allreduce(torch.zeros(3 + c.rank))),
        ("allreduce", lambda c: c.allreduce(torch.zeros(3, dtype=torch.float64 if c.rank else torch.float32))),
        ("allreduce", lambda c: c.allreduce(torch.zeros(3), "max" if c.rank else "sum")),
        ("broadcast", lambda c: c.broadcast(torch.zeros(3), root=c.rank)),
        ("iallreduce", lambda c: c.iallreduce(torch.zeros(2 * c.rank + 1)).wait()),
    ],
    ids=["shape", "dtype", "op", "root", "nonblocking"],
)
def test_debug_mode_catches_mismatch_on_every_rank(comm, call):
    if comm.size < 2:
        pytest.skip("ranks can only disagree in a world of two or more")
    name, fn = call
    checked = CheckedComm(comm)  # around any backend: mpi4py, a duplicate, gloo
    with pytest.raises(CollectiveMismatchError, match=f"ranks called {name} with different arguments") as err:
        fn(checked)
    assert "rank 1:" in str(err.value)  # names every rank's arguments


def test_debug_mode_passes_agreeing_calls(comm):
    checked = CheckedComm(comm)
    x = torch.ones(5)
    assert checked.allreduce(x) is x
    assert x.tolist() == [float(comm.size)] * 5


def test_debug_is_a_wrapper_only_when_asked_for(monkeypatch):
    # Off, init returns the backend itself (the stall watchdog and the per-call check off too):
    # debug mode costs nothing when unused.
    monkeypatch.delenv("MPI_SGD_DEBUG", raising=False)
    monkeypatch.setenv("MPI_SGD_CALL_CHECK", "0")
    assert type(init("mpi4py", abort_on_error=False, stall_timeout=0)) is MPIComm
    monkeypatch.setenv("MPI_SGD_DEBUG", "1")
    checked = init("mpi4py", abort_on_error=False, stall_timeout=0)
    assert type(checked) is CheckedComm and type(checked.inner) is MPIComm
    assert type(init("mpi4py", debug=False, abort_on_error=False, stall_timeout=0)) is MPIComm


def test_the_per_call_check_is_on_by_default_when_ranks_can_disagree(monkeypatch):
    from mpi_sgd.comm.wrappers.callcheck import CallCheck

    monkeypatch.delenv("MPI_SGD_DEBUG", raising=False)
    monkeypatch.delenv("MPI_SGD_CALL_CHECK", raising=False)
    comm = init("mpi4py", abort_on_error=False, stall_timeout=0)
    assert type(comm) is (CallCheck if comm.size > 1 else MPIComm)
    x = torch.ones(3)
    comm.allreduce(x)
    assert x.tolist() == [float(comm.size)] * 3


def test_the_stall_watchdog_is_on_by_default_when_there_is_someone_to_wait_for(monkeypatch):
    monkeypatch.delenv("MPI_SGD_DEBUG", raising=False)
    monkeypatch.delenv("MPI_SGD_STALL_TIMEOUT", raising=False)
    comm = init("mpi4py", abort_on_error=False)
    if comm.size == 1:
        assert type(comm) is MPIComm
        return
    assert type(comm) is Watchdog and type(comm.inner.inner) is MPIComm and comm.timeout == 60
    comm.close()
    monkeypatch.setenv("MPI_SGD_STALL_TIMEOUT", "7.5")
    comm = init("mpi4py", abort_on_error=False)
    assert type(comm) is Watchdog and comm.timeout == 7.5
    comm.close()


def test_parameter_rejected_but_its_data_accepted(mpicomm):
    p = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(CommError, match="requires grad"):
        mpicomm.allreduce(p)
    mpicomm.allreduce(p.data)  # same memory, no autograd: the way to communicate weights
    assert p.tolist() == [float(mpicomm.size)] * 3


def test_fast_path_writes_into_the_tensor_itself(mpicomm):
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    before = x.data_ptr()
    mpicomm.allreduce(x[1])  # a contiguous row: a view with an offset into x's storage
    assert x.data_ptr() == before and x[0].tolist() == [0, 1, 2]
    assert x[1].tolist() == [v * mpicomm.size for v in (3.0, 4.0, 5.0)]
