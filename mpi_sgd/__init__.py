"""mpi_sgd: MPI data-parallel training you can read, run and measure."""

__version__ = "0.1.0"
