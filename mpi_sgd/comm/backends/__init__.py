"""The backends: each implements the whole seam (:class:`~mpi_sgd.comm.base.Communicator`).

* :mod:`.mpi`: mpi4py's buffer methods on the tensors' own memory (the default, ``"mpi4py"``), with
  :mod:`.mpitypes` for torch dtypes as MPI datatypes and ops;
* :mod:`.local`: world size 1 with no MPI at all (``"local"``);
* :mod:`.torch_dist`: ``torch.distributed`` with gloo, mpi or nccl, rendezvousing over MPI
  (:mod:`.rendezvous`);
* :mod:`.torch_mpi4py`: a torch process group written over mpi4py (``"torch-mpi4py"``):
  :mod:`.mpi4py_group` the group, :mod:`.mpi4py_checks` what it refuses, :mod:`.mpi4py_work` the
  works torch waits on, whose requests complete on :mod:`.progress` threads.

Which of torch's this torch can run (:func:`backend_available`, :func:`unavailable`) is asked here,
torch imported only then.
"""

# torch.distributed's, behind TorchDistComm; torch-mpi4py is torch over this project's "mpi4py" group
TORCH_BACKENDS = ("torch-mpi4py", "gloo", "mpi", "nccl")
BACKENDS = ("mpi4py", "local", *TORCH_BACKENDS)  # every name comm.init() accepts


def backend_available(name: str) -> bool:
    """Whether this torch can run backend ``name`` (torch is imported here, not with the package)."""
    import torch.distributed as dist

    if name == "torch-mpi4py":
        from . import torch_mpi4py  # noqa: F401 - registers the backend; always there

        return True
    return {"gloo": dist.is_gloo_available, "mpi": dist.is_mpi_available, "nccl": dist.is_nccl_available}[name]()


def unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run with this torch, and what to use instead; None if it can."""
    if backend_available(name):
        return None
    return {
        "mpi": "this torch was built without MPI (the pip wheels are); use --backend torch-mpi4py "
        "(torch.distributed over mpi4py, no build needed), mpi4py (the default) or gloo, or build "
        "torch from source against your MPI",
        "nccl": "this torch has no NCCL (a CPU build, or no CUDA); use gloo or mpi4py",
        "gloo": "this torch was built without gloo",
    }[name]
