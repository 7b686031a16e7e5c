"""The backends: each implements the whole seam (:class:`~mpi_sgd.comm.base.Communicator`).

* :mod:`.mpi`: mpi4py's buffer methods on the tensors' own memory (the default, ``"mpi4py"``), with
  :mod:`.mpitypes` for torch dtypes as MPI datatypes and ops;
* :mod:`.local`: world size 1 with no MPI at all (``"local"``);
* :mod:`.torch_dist`: ``torch.distributed`` with gloo, mpi or nccl, rendezvousing over MPI
  (:mod:`.rendezvous`);
* :mod:`.torch_mpi4py`: a torch process group written over mpi4py (``"torch-mpi4py"``):
  :mod:`.mpi4py_group` the group, :mod:`.mpi4py_checks` what it refuses, :mod:`.mpi4py_work` the
  works torch waits on, whose requests complete on :mod:`.progress` threads.
"""

# torch.distributed's, behind TorchDistComm; torch-mpi4py is torch over this project's "mpi4py" group
TORCH_BACKENDS = ("torch-mpi4py", "gloo", "mpi", "nccl")
BACKENDS = ("mpi4py", "local", *TORCH_BACKENDS)  # every name comm.init() accepts
