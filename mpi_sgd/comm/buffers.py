"""Turning torch tensors and numpy arrays into memory MPI can read, without copying.

A contiguous CPU tensor and its ``.numpy()`` view share storage, so handing the view to
mpi4py's buffer methods is zero-copy. (The mpi4py backend names a plain tensor's memory more
directly still, see :func:`mpi_sgd.comm.backends.mpi._spec`, and comes here for everything else; passing
the tensor itself would go through mpi4py's DLPack path, which costs far more per call.)

:func:`as_array` does no checks of its own on the way through: ``.numpy()`` already refuses
CUDA tensors, tensors that require grad and dtypes numpy lacks (bfloat16). Only when something
refuses do we work out *why* and raise a :class:`CommError` that says what to do instead.
"""

from __future__ import annotations

import numpy as np

from .errors import CommError

try:  # torch is a dependency, but keep the MPI layer importable without it
    import torch
except ImportError:  # pragma: no cover
    torch = None


def diagnose(buf) -> CommError:
    """Explain why ``buf`` cannot be handed to MPI as it is."""
    if torch is not None and isinstance(buf, torch.Tensor):
        if buf.is_cuda or buf.device.type not in ("cpu",):
            return CommError(
                f"tensor on {buf.device} given to the mpi4py backend, and this MPI is not CUDA-aware. Use "
                "comm.init(), which stages GPU tensors through host memory, the nccl backend, or set "
                "MPI_SGD_CUDA_AWARE=1 if your MPI library was built with CUDA support."
            )
        if buf.dtype in (torch.bfloat16,) or not _numpy_dtype_ok(buf.dtype):
            return CommError(
                f"dtype {buf.dtype} has no MPI datatype; convert explicitly, e.g. t.float() "
                "before the collective and back afterwards."
            )
        if not buf.is_contiguous():
            return CommError(
                f"tensor of shape {tuple(buf.shape)} and strides {buf.stride()} is not contiguous; "
                "MPI needs one dense block of memory. Call .contiguous() (that copies) or "
                "communicate the base tensor instead."
            )
        if buf.requires_grad:
            return CommError(
                "tensor requires grad; communicate t.data or t.detach() (same memory), not the autograd leaf itself."
            )
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            return CommError(
                f"array of shape {buf.shape} and strides {buf.strides} is not C-contiguous; "
                "use np.ascontiguousarray (that copies) or communicate the base array."
            )
        from mpi4py import MPI

        try:
            MPI.Datatype.fromcode(buf.dtype.char)
        except (KeyError, ValueError):
            return CommError(f"dtype {buf.dtype} has no MPI datatype in this MPI library; convert it first.")
    if not isinstance(buf, np.ndarray) and (torch is None or not isinstance(buf, torch.Tensor)):
        return CommError(f"expected a torch.Tensor or numpy.ndarray, got {type(buf).__name__}")
    return CommError(f"cannot communicate {type(buf).__name__} of dtype {buf.dtype}")


def _numpy_dtype_ok(dtype) -> bool:
    try:
        torch.empty(0, dtype=dtype).numpy()
    except (TypeError, RuntimeError):
        return False
    return True


def as_array(buf) -> np.ndarray:
    """A numpy view sharing ``buf``'s memory. Raises :class:`CommError` with a fix if impossible."""
    if isinstance(buf, np.ndarray):
        if buf.flags.c_contiguous:
            return buf
        raise diagnose(buf)
    try:
        view = buf.numpy()
    except (TypeError, RuntimeError, AttributeError):
        from .gpu import cuda_aware

        if torch is not None and isinstance(buf, torch.Tensor) and buf.is_cuda and cuda_aware():
            return buf  # mpi4py reads __cuda_array_interface__ / DLPack itself
        raise diagnose(buf) from None
    if not view.flags.c_contiguous:
        raise diagnose(buf)
    return view


def signature(buf) -> tuple:
    """(shape, dtype) as plain strings: what must agree across ranks for a collective."""
    if buf is None:
        return (None, None)
    return (tuple(buf.shape), str(buf.dtype).replace("torch.", ""))


def zeros(numel: int, dtype=None, device=None):
    """A zeroed 1-D tensor for communication: gradient buckets, benchmark buffers.

    On the CPU it is allocated by numpy, which asks Linux for transparent huge pages for arrays of
    4 MiB and more (``madvise``) where torch's allocator does not. MPI's shared-memory transport
    streams large buffers through memory, and with 4 KiB pages it pays for TLB misses on every
    large all-reduce (``mpi-sgd bench allreduce --impls seam,seam-torchalloc`` compares the two).
    The tensor shares numpy's memory and is otherwise an ordinary tensor. Other devices, and
    dtypes numpy lacks (bfloat16), use ``torch.zeros``.
    """
    dtype = torch.float32 if dtype is None else dtype
    if device is None or torch.device(device).type == "cpu":
        try:
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        except (TypeError, RuntimeError):
            pass
        else:
            return torch.from_numpy(np.zeros(numel, dtype=np_dtype))
    return torch.zeros(numel, dtype=dtype, device=device)
