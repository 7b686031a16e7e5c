"""The communicator seam and its backends; :func:`init` picks one."""

from __future__ import annotations

from .base import (
    ANY_SOURCE,
    ANY_TAG,
    OPS,
    CollectiveMismatchError,
    CommError,
    Communicator,
    Request,
    Status,
    split_counts,
)

BACKENDS = ("mpi4py", "local", "gloo", "mpi", "nccl")


def init(backend: str = "mpi4py", debug: bool | None = None, abort_on_error: bool = True) -> Communicator:
    """Start the communicator for this process.

    ``mpi4py`` (the default) works at any size, ``python script.py`` included (MPI's singleton
    mode); ``local`` is world size 1 with no MPI at all; ``gloo``/``mpi``/``nccl`` are
    torch.distributed backends rendezvousing over mpi4py. With ``abort_on_error`` an uncaught
    exception on any rank aborts the whole job instead of leaving the others waiting.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "local":
        from .local import LocalComm

        return LocalComm()
    from .mpi import MPIComm

    comm: Communicator = MPIComm(debug=debug)
    if backend != "mpi4py":
        from .torch_dist import TorchDistComm

        comm = TorchDistComm(backend, comm)
    if abort_on_error:
        from ..launch import install_abort_hook

        install_abort_hook(comm)
    return comm


__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "BACKENDS",
    "OPS",
    "CollectiveMismatchError",
    "CommError",
    "Communicator",
    "Request",
    "Status",
    "init",
    "split_counts",
]
