"""The communicator seam and its backends; :func:`init` picks one and wraps it.

``base.py`` is the seam, ``backends/`` implement it, ``wrappers/`` add one concern each around any
backend, ``shm/`` is the node-shared all-reduce the mpi4py backend uses; ``buffers.py`` and
``gpu.py`` turn tensors into memory a transport can read.
"""

from __future__ import annotations

import os

from .backends import BACKENDS, TORCH_BACKENDS
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


def init(
    backend: str = "mpi4py",
    debug: bool | None = None,
    abort_on_error: bool = True,
    stall_timeout: float | None = None,
    stall_abort: float | None = None,
) -> Communicator:
    """Start the communicator for this process.

    ``mpi4py`` (the default) works at any size, ``python script.py`` included (MPI's singleton
    mode); ``local`` is world size 1 with no MPI at all; ``gloo``/``mpi``/``nccl`` are
    torch.distributed backends rendezvousing over mpi4py, and ``torch-mpi4py`` is torch.distributed
    over this project's ``"mpi4py"`` process group (:mod:`.backends.torch_mpi4py`). Where CUDA is present,
    ``mpi4py`` takes GPU tensors too (:func:`_for_gpus`). With ``debug`` (default: the
    ``MPI_SGD_DEBUG`` environment variable) the communicator is wrapped in a
    :class:`~mpi_sgd.comm.wrappers.checked.CheckedComm`, which compares every collective's arguments across
    ranks first. With ``abort_on_error`` an uncaught exception on any rank aborts the whole job
    instead of leaving the others waiting.

    In a job of more than one rank, a :class:`~mpi_sgd.comm.wrappers.watchdog.Watchdog` reports a rank that
    waits in one call ``stall_timeout`` seconds (default ``MPI_SGD_STALL_TIMEOUT``, else 60; 0: no
    watchdog), names the missing ranks and aborts (``stall_abort``: see the watchdog). With
    ``MPI_SGD_FAULT`` set, a :class:`~mpi_sgd.comm.wrappers.faults.FaultComm` goes around it all.
    The mpi4py backend's reductions are checked across ranks as they run
    (:class:`~mpi_sgd.comm.wrappers.callcheck.CallCheck`; ``MPI_SGD_CALL_CHECK=0``: not).
    ``close()`` on what it returns frees all of it (:meth:`Communicator.close`).
    """
    from ..launch import check_world, env_flag, env_seconds, install_abort_hook

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "local":
        from .backends.local import LocalComm

        comm: Communicator = LocalComm()
    else:
        from .backends.mpi import MPIComm

        comm = MPIComm()
        check_world(comm.size)  # srun without PMI: N singletons that would each train alone
        if backend == "mpi4py":
            if comm.size > 1 and env_flag("MPI_SGD_CALL_CHECK", default=True):
                from .wrappers.callcheck import CallCheck

                comm = CallCheck(comm)  # reductions whose ranks disagree raise, never return a wrong sum
            comm = _for_gpus(comm)
        else:
            from .backends.torch_dist import TorchDistComm

            comm = TorchDistComm(backend, comm, owns_mpi=True)
            if backend == "nccl":
                from .wrappers.staged import DeviceStagedComm

                comm = DeviceStagedComm(comm, comm.device)  # NCCL reduces device memory only
    if env_flag("MPI_SGD_DEBUG") if debug is None else debug:
        from .wrappers.checked import CheckedComm

        comm = CheckedComm(comm)
    if stall_timeout is None:
        stall_timeout = env_seconds("MPI_SGD_STALL_TIMEOUT", 60.0)
    if stall_timeout > 0 and comm.size > 1:
        from .wrappers.watchdog import Watchdog

        comm = Watchdog(comm, stall_timeout, stall_abort)
    if os.environ.get("MPI_SGD_FAULT"):
        from .wrappers.faults import Fault, FaultComm

        comm = FaultComm(comm, Fault.parse(os.environ["MPI_SGD_FAULT"]))
    from .wrappers.wrapper import CommWrapper

    layer = comm
    while isinstance(layer, CommWrapper):  # every layer made here: closing the top closes them all
        layer.owns_inner = True
        layer = layer.inner
    if abort_on_error:
        install_abort_hook(comm)
    return comm


def check_environment(world_size: int, environ=None) -> None:
    """Raise ValueError, in one line, for a ``MPI_SGD_*`` variable :func:`init` would refuse or
    ignore: the same checks as the flags, before any rank starts MPI (a bad value would otherwise
    fail after it, on every rank), and a fault for a rank the job does not have."""
    from ..launch import env_seconds

    environ = os.environ if environ is None else environ
    env_seconds("MPI_SGD_STALL_TIMEOUT", 60.0, environ)
    from .shm.settings import node_size_override, timeout_setting

    timeout_setting(environ=environ)
    node_size_override(environ=environ)
    if environ.get("MPI_SGD_FAULT"):
        from .wrappers.faults import Fault

        fault = Fault.parse(environ["MPI_SGD_FAULT"])
        if fault.rank >= world_size:
            raise ValueError(
                f"MPI_SGD_FAULT={fault} names rank {fault.rank}, but this job has {world_size} rank(s) "
                f"(0-{world_size - 1}): the fault would never happen"
            )


def check_fault_step(last_step: int, environ=None) -> None:
    """Raise ValueError, in one line, where ``MPI_SGD_FAULT`` names a step after ``last_step``, the
    last of a run that starts at step 1: the fault would never fire, and a drill that meant to
    show a failure would report a clean run."""
    environ = os.environ if environ is None else environ
    if environ.get("MPI_SGD_FAULT"):
        from .wrappers.faults import Fault

        fault = Fault.parse(environ["MPI_SGD_FAULT"])
        if fault.step > last_step:
            raise ValueError(
                f"MPI_SGD_FAULT={fault} is at step {fault.step}, but this run ends at step {last_step}: "
                "the fault would never happen"
            )


def _for_gpus(comm: Communicator) -> Communicator:
    """GPU tensors through MPI: as they are if the library is CUDA-aware, else staged via the host."""
    import torch

    if not torch.cuda.is_available():
        return comm
    from .gpu import cuda_aware

    if cuda_aware():
        return comm  # MPIComm hands device memory to MPI itself, after a stream sync
    from .wrappers.staged import StagedComm

    return StagedComm(comm)


__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "BACKENDS",
    "TORCH_BACKENDS",
    "OPS",
    "CollectiveMismatchError",
    "CommError",
    "Communicator",
    "Request",
    "Status",
    "check_environment",
    "init",
    "split_counts",
]
