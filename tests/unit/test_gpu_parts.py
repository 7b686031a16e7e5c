"""The GPU helpers' logic that needs no GPU: the CUDA-aware switch and host staging buffers."""

import torch

from mpi_sgd.comm import gpu


def test_cuda_aware_can_be_declared_either_way(monkeypatch):
    probe = gpu.cuda_aware.__wrapped__  # uncached: each call reads the environment again
    monkeypatch.setenv("MPI_SGD_CUDA_AWARE", "1")
    assert probe() is True
    monkeypatch.setenv("MPI_SGD_CUDA_AWARE", "0")
    assert probe() is False


def test_staging_round_trip_and_reuse():
    buffers = gpu.HostBuffers(pin=False)  # CPU tensors stand in for device ones: the logic is the same
    t = torch.arange(6.0).view(2, 3)
    host = buffers.stage_in(t)
    assert host.shape == (6,) and host.data_ptr() != t.data_ptr() and torch.equal(host, t.reshape(-1))
    host += 10  # what MPI would write into the host copy
    buffers.stage_out(host, t)
    assert torch.equal(t, torch.arange(6.0).view(2, 3) + 10)
    assert buffers.take(t) is host  # the same (dtype, size) reuses the buffer
    assert buffers.take(t) is not host  # it was handed out: a new one
    assert buffers.take(torch.zeros(6, dtype=torch.float64)).dtype == torch.float64
