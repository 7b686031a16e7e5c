"""Fault drills: make one rank's process die in the middle of training, the way a crash would.

:class:`ExitAfter` wraps a communicator and ends the process at its ``sends``-th send: no
``MPI_Finalize``, no ``MPI_Abort``, no message to anyone, exit status 1, which is what the rest
of the job sees when a worker's machine goes away (under hydra a death by *signal* brings the
whole job down whatever the launcher flags, so a drill that means to be survived exits instead;
see :mod:`mpi_sgd.paramserver`). Everything else is delegated to the wrapped communicator.
"""

from __future__ import annotations

import os
import sys

from ..comm.wrappers.wrapper import CommWrapper


class ExitAfter(CommWrapper):
    def __init__(self, inner, sends: int, code: int = 1):
        if sends < 1:
            raise ValueError(f"sends must be at least 1, got {sends}")
        super().__init__(inner)
        self.left, self.code = sends, code

    def _count(self) -> None:
        self.left -= 1
        if self.left == 0:
            print(f"rank {self.inner.rank}: exiting now (fault drill)", flush=True)
            sys.stderr.flush()
            os._exit(self.code)

    def send(self, buf, dest, tag=0):
        self._count()
        return self.inner.send(buf, dest, tag)

    def isend(self, buf, dest, tag=0):
        self._count()
        return self.inner.isend(buf, dest, tag)
