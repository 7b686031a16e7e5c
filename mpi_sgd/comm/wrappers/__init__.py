"""Wrapper communicators: one cross-cutting concern each, around any communicator.

:class:`~.wrapper.CommWrapper` delegates the whole seam; each wrapper overrides what its concern
changes. They stack, and :meth:`~mpi_sgd.comm.base.Communicator.split` re-wraps a sub-communicator
with the same settings.

* :mod:`.checked`: debug mode, every collective's arguments compared across ranks first;
* :mod:`.watchdog` (with :mod:`.monitor` and :mod:`.stallreport`): a rank waiting too long names
  who is missing, and the job ends;
* :mod:`.faults`: make one rank fail on purpose (``MPI_SGD_FAULT``);
* :mod:`.counting`: the bytes each collective is handed;
* :mod:`.compress`: all-reduce in 16 bits;
* :mod:`.staged`: GPU tensors through host memory for an MPI that cannot read device memory.
"""

from .wrapper import CommWrapper

__all__ = ["CommWrapper"]
