"""GPU tensors and MPI: device memory for a CUDA-aware MPI library, pinned host copies otherwise.

MPI reads and writes memory directly, outside any CUDA stream, while torch queues kernels on a
stream and returns before they run. So before MPI touches a GPU tensor, the kernels that write it
must have finished: :func:`sync` waits for the tensor's current stream (a no-op on the CPU). After
MPI has written a tensor, later kernels see the data, since they are queued after the call returns.

Whether MPI can be handed a device pointer at all is the library's build: :func:`cuda_aware` asks
it (``MPIX_GPU_query_support`` in MPICH 4 and later, ``MPIX_Query_cuda_support`` in Open MPI; mpi4py
wraps neither, so they are looked up in the loaded library), and ``MPI_SGD_CUDA_AWARE=1`` or ``=0``
overrides the answer. Where it cannot, :class:`HostBuffers` keeps pinned (page-locked) host buffers
to stage through: pinned memory copies at full PCIe speed and can be reused call after call, where
``tensor.cpu()`` would allocate pageable memory each time.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections import defaultdict

import torch

from ..launch import env_flag

MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's mpi.h


@functools.cache
def cuda_aware() -> bool:
    """Whether the MPI library in this process takes CUDA device memory (asked once)."""
    if os.environ.get("MPI_SGD_CUDA_AWARE", "").strip():
        return env_flag("MPI_SGD_CUDA_AWARE")
    from mpi4py import MPI  # the library must be loaded (and initialised) before it is asked

    assert MPI.Is_initialized()
    for path in _loaded_mpi_libraries():
        try:
            lib = ctypes.CDLL(path)  # already loaded: this only returns its handle
        except OSError:
            continue
        if hasattr(lib, "MPIX_GPU_query_support"):
            flag = ctypes.c_int(0)
            if lib.MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag)) == 0:
                return bool(flag.value)
        if hasattr(lib, "MPIX_Query_cuda_support"):
            return bool(lib.MPIX_Query_cuda_support())
    return False


def _loaded_mpi_libraries() -> list[str]:
    """Paths of the MPI libraries mapped into this process (libmpi.so.12 for MPICH, .40 Open MPI)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line}
    except OSError:  # not Linux: the library cannot be found by path; "not CUDA-aware" is the safe answer
        return []
    return sorted(p for p in paths if ".so" in os.path.basename(p))


def local_device(name: str, local_rank: int, local_size: int = 1) -> torch.device:
    """The device ``name`` means for this rank: for ``cuda`` without an index, GPU ``local_rank`` of
    its host (one GPU per rank), made current so that later ``cuda`` allocations land there too."""
    device = torch.device(name)
    if device.type != "cuda" or device.index is not None:
        return device
    if not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch sees no CUDA device here (a CPU build of torch, or no GPU)")
    if local_rank >= torch.cuda.device_count():
        raise ValueError(
            f"--device {name}: {local_size} ranks on this host but {torch.cuda.device_count()} GPU(s); "
            "start at most one rank per GPU"
        )
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def sync(t: torch.Tensor) -> None:
    """Wait until every kernel queued so far on ``t``'s current stream is done (no-op on CPU)."""
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()


class HostBuffers:
    """Reusable host buffers to stage device tensors through, pinned where CUDA is present.

    ``take(like)`` returns a flat host buffer for ``like.numel()`` elements of its dtype, ``give``
    returns it for reuse. Buffers are kept by (dtype, size), so a training loop that communicates
    the same gradient buckets every step allocates them once.
    """

    def __init__(self, pin: bool | None = None):
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._free: dict[tuple, list[torch.Tensor]] = defaultdict(list)

    def take(self, like: torch.Tensor) -> torch.Tensor:
        free = self._free[(like.dtype, like.numel())]
        if free:
            return free.pop()
        return torch.empty(like.numel(), dtype=like.dtype, pin_memory=self.pin)

    def give(self, buf: torch.Tensor) -> None:
        self._free[(buf.dtype, buf.numel())].append(buf)

    def stage_in(self, t: torch.Tensor) -> torch.Tensor:
        """A host copy of ``t``, complete (the copy and every kernel before it have finished)."""
        host = self.take(t)
        host.copy_(t.reshape(-1), non_blocking=True)
        sync(t)
        return host

    def stage_out(self, host: torch.Tensor, t: torch.Tensor) -> None:
        """Copy ``host`` back into ``t``, then free ``host`` for reuse once the copy is done."""
        t.copy_(host.view_as(t), non_blocking=True)
        sync(t)  # the buffer may be handed out again right away: the copy must have read it
        self.give(host)
