"""torch tensors as MPI sees them: datatypes, reduction ops (16-bit floats included), buffers.

MPI predefines datatypes for the C types, so most torch dtypes map directly. Two do not:

* ``float16``: MPICH has ``MPIX_C_FLOAT16`` with its built-in ops; other libraries may not. Before
  MPICH 5 (and in Intel MPI, built on it) its datatype engine may lack the type (pmodels/mpich#7342):
  Debian's MPICH 4.0.2 aborts any float16 all-reduce between ranks with an assertion in
  ``typerep_yaksa_pack.c``, so there it is emulated like bfloat16.
* ``bfloat16``: no MPI library predefines it today.

Such a dtype travels as ``MPI.UINT16_T`` (any 2-byte type moves the bytes) and its reductions are
user-defined ops (``MPI.Op.Create``) that view MPI's two buffers as the torch dtype and combine
them with torch, in place: ``inout = op(in, inout)``. Each pair of elements is combined in the
16-bit dtype, rounded once per addition, as gloo and a 16-bit CPU ``sum`` of two terms do. MPI
calls the op on whole segments of the message, so its Python overhead is paid per segment, not
per element.
"""

from __future__ import annotations

import torch
from mpi4py import MPI

OPS = ("sum", "avg", "min", "max", "prod", "band", "bor", "bxor")
_NATIVE_OPS = {
    "sum": MPI.SUM,
    "avg": MPI.SUM,
    "min": MPI.MIN,
    "max": MPI.MAX,
    "prod": MPI.PROD,
    "band": MPI.BAND,
    "bor": MPI.BOR,
    "bxor": MPI.BXOR,
}
# bool has no arithmetic in MPI; torch treats a sum of bools as "any" and a product as "all".
_BOOL_OPS = {
    "sum": MPI.LOR,
    "max": MPI.LOR,
    "bor": MPI.LOR,
    "min": MPI.LAND,
    "prod": MPI.LAND,
    "band": MPI.LAND,
    "bxor": MPI.LXOR,
}
_TORCH_OPS = {
    "sum": lambda inout, x: inout.add_(x),
    "avg": lambda inout, x: inout.add_(x),
    "prod": lambda inout, x: inout.mul_(x),
    "min": lambda inout, x: torch.minimum(inout, x, out=inout),
    "max": lambda inout, x: torch.maximum(inout, x, out=inout),
}


def _native_types() -> dict:
    out = {}
    for dtype in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
        torch.complex64,
        torch.complex128,
    ):
        try:
            out[dtype] = MPI.Datatype.fromcode(torch.empty(0, dtype=dtype).numpy().dtype.char)
        except (KeyError, ValueError):
            pass  # not in this MPI library (float16 in some): emulated below
    return out


def _float16_works(version: str) -> bool:
    """Whether ``MPI_Get_library_version``'s text names a library whose float16 can be trusted
    (see the module docstring): not MPICH before 5, nor Intel MPI."""
    import re

    if "Intel" in version:
        return False
    mpich = re.search(r"MPICH Version:\s*(\d+)", version)
    return not mpich or int(mpich.group(1)) >= 5


NATIVE = _native_types()
# Before MPICH 5 (and Intel MPI, built on it), also: MPI_Reduce with MPI_IN_PLACE at the root
# segfaults in Debian's MPICH 4.0.2 at three ranks (measured), so the backend's root reduces into
# a scratch buffer there.
OLD_MPICH = not _float16_works(MPI.Get_library_version())
if OLD_MPICH:
    NATIVE.pop(torch.float16, None)
EMULATED = {dt: MPI.UINT16_T for dt in (torch.float16, torch.bfloat16) if dt not in NATIVE}
_user_ops: dict[tuple, MPI.Op] = {}


def datatype(dtype: torch.dtype) -> MPI.Datatype | None:
    """The MPI datatype that carries ``dtype`` (None if MPI cannot carry it at all)."""
    return NATIVE.get(dtype) or EMULATED.get(dtype)


def reduce_op(op: str, dtype: torch.dtype) -> MPI.Op:
    """The MPI op for ``op`` on ``dtype`` ("avg" is a sum; the caller divides). Raises ``TypeError``."""
    if dtype == torch.bool:
        if op not in _BOOL_OPS:
            raise TypeError(f"op {op!r} is not defined for torch.bool")
        return _BOOL_OPS[op]
    if dtype in EMULATED:
        if op not in _TORCH_OPS:
            raise TypeError(f"op {op!r} is not defined for {dtype}")
        return _user_op(op, dtype)
    if op in ("band", "bor", "bxor") and (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(f"op {op!r} needs an integer dtype, got {dtype}")
    if op in ("min", "max") and dtype.is_complex:
        raise TypeError(f"op {op!r} is not defined for complex dtype {dtype}")
    return _NATIVE_OPS[op]


def _user_op(op: str, dtype: torch.dtype) -> MPI.Op:
    key = (op, dtype)
    if key not in _user_ops:
        combine = _TORCH_OPS[op]

        def fn(inbuf, inoutbuf, _datatype):
            combine(torch.frombuffer(inoutbuf, dtype=dtype), torch.frombuffer(inbuf, dtype=dtype))

        _user_ops[key] = MPI.Op.Create(fn, commute=True)
    return _user_ops[key]


def buffer(t: torch.Tensor, length: int | None = None) -> list:
    """``[memory, MPI datatype]`` naming a contiguous tensor's own memory (no copy, no checks; CUDA
    memory only for a CUDA-aware MPI): its bytes, or ``length`` bytes from its start (several
    adjacent tensors as one). No count: mpi4py derives it from the byte length, and for the
    gathered side of gather/allgather splits it over the ranks, as it does for arrays."""
    return [MPI.buffer.fromaddress(t.data_ptr(), nbytes(t) if length is None else length), datatype(t.dtype)]


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def as_bytes(t: torch.Tensor) -> list:
    """The tensor's memory as plain bytes (for calls that only move data, never reduce it)."""
    return [MPI.buffer.fromaddress(t.data_ptr(), nbytes(t)), MPI.BYTE]


def scattered(tensors) -> list:
    """One ``MPI_*v`` buffer spec (buffer, counts, displacements, datatype) for tensors anywhere in
    memory, in bytes from the lowest address among them. MPI reads or writes only the described
    bytes, never the gaps between them, so separately allocated tensors are used in place."""
    addrs = [t.data_ptr() for t in tensors]
    sizes = [nbytes(t) for t in tensors]
    used = [(a, n) for a, n in zip(addrs, sizes, strict=True) if n]  # an empty tensor may have no address
    base = min((a for a, _ in used), default=0)
    end = max((a + n for a, n in used), default=0)
    displs = [a - base if n else 0 for a, n in zip(addrs, sizes, strict=True)]
    return [MPI.buffer.fromaddress(base, end - base), sizes, displs, MPI.BYTE]


def adjacent(tensors) -> bool:
    """Whether the tensors lie back to back in memory, in order (views of one buffer, say)."""
    return all(b.data_ptr() == a.data_ptr() + nbytes(a) for a, b in zip(tensors[:-1], tensors[1:], strict=True))
