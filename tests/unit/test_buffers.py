"""Buffers handed to MPI: zero-copy where possible, a clear error where not. No MPI needed."""

import numpy as np
import pytest
import torch

from mpi_sgd.comm.base import CommError, check_op, displacements, split_counts
from mpi_sgd.comm.buffers import as_array, signature


def test_tensor_view_shares_memory():
    t = torch.zeros(5)
    view = as_array(t)
    view[2] = 7.0  # what MPI writes into the view lands in the tensor: no copy
    assert t[2].item() == 7.0
    assert view.ctypes.data == t.data_ptr()


def test_numpy_passes_through():
    a = np.zeros(3)
    assert as_array(a) is a


@pytest.mark.parametrize(
    "buf, message",
    [
        (torch.zeros(4, 4).t(), "not contiguous"),
        (torch.zeros(3, dtype=torch.bfloat16), "bfloat16 has no MPI datatype"),
        (torch.zeros(3, requires_grad=True), "requires grad"),
        (torch.zeros(3, device="meta"), "this MPI is not CUDA-aware"),
        (np.zeros((4, 4))[:, 1], "not C-contiguous"),
        ([1.0, 2.0], "expected a torch.Tensor or numpy.ndarray"),
    ],
    ids=["strided", "bfloat16", "requires-grad", "device", "numpy-strided", "list"],
)
def test_unsupported_buffers_explain_the_fix(buf, message):
    with pytest.raises(CommError, match=message):
        as_array(buf)


@pytest.mark.parametrize("n, parts", [(10, 3), (2, 3), (0, 2), (7, 7), (1001, 4)])
def test_split_counts_cover_everything_evenly(n, parts):
    counts = split_counts(n, parts)
    assert len(counts) == parts and sum(counts) == n and max(counts) - min(counts) <= 1
    assert counts == [len(c) for c in np.array_split(np.arange(n), parts)]
    assert displacements(counts) == list(np.cumsum([0] + counts[:-1]))


def test_check_op():
    assert check_op("avg") == "avg"
    with pytest.raises(ValueError, match="sum, avg, min, max, prod"):
        check_op("mean")


def test_signature_is_comparable_across_backends():
    assert signature(torch.zeros(2, 3)) == signature(torch.zeros(2, 3))
    assert signature(torch.zeros(2, 3)) != signature(torch.zeros(2, 3, dtype=torch.float64))
    assert signature(np.zeros((2, 3), np.float32)) == ((2, 3), "float32") == signature(torch.zeros(2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
def test_comm_zeros_is_an_ordinary_zeroed_tensor(dtype):
    from mpi_sgd.comm.buffers import zeros

    t = zeros(5 << 20, dtype)  # above numpy's 4 MiB huge-page threshold
    assert t.dtype == dtype and t.shape == (5 << 20,) and t.is_contiguous() and not t.any()
    t[3] = 1
    assert t.sum().item() == 1


def test_float16_is_emulated_where_the_library_cannot_carry_it():
    # Debian's MPICH 4.0.2 aborts a float16 all-reduce between ranks (pmodels/mpich#7342); the
    # MPICH 5 wheel and Open MPI 5 reduce it natively (tests/mpi sums float16 under each).
    from mpi_sgd.comm.backends.mpitypes import _float16_works

    assert not _float16_works("MPICH Version:\t4.0.2\nMPICH Release date:\tThu Apr  7 12:34:45 CDT 2022")
    assert not _float16_works("Intel(R) MPI Library 2021.18.1 for Linux* OS")
    assert _float16_works("MPICH Version:      5.0.2\nMPICH Release date: ...")
    assert _float16_works("Open MPI v5.0.11, package: Open MPI ...")
