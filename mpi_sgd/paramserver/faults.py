"""Fault drills: make one rank's process die in the middle of training, the way a crash would.

:class:`ExitAfter` wraps a communicator and ends the process at its ``sends``-th send: no
``MPI_Finalize``, no ``MPI_Abort``, no message to anyone, exit status 1, which is what the rest
of the job sees when a worker's machine goes away (under hydra a death by *signal* brings the
whole job down whatever the launcher flags, so a drill that means to be survived exits instead;
see :mod:`mpi_sgd.paramserver`). Everything else is delegated to the wrapped communicator. The
count is the process's: a part split off the communicator shares it, so the process still exits
at its ``sends``-th send, whichever communicator makes it.
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
        self.code = code
        self.left = [sends]  # sends to go, in a list that the parts split off this one share

    def _rewrap(self, inner):
        part = self._rebuild(inner)
        part.left = self.left
        return part

    def _count(self) -> None:
        self.left[0] -= 1
        if self.left[0] == 0:
            print(f"rank {self.inner.rank}: exiting now (fault drill)", flush=True)
            sys.stderr.flush()
            os._exit(self.code)

    def send(self, buf, dest, tag=0):
        self._count()
        return self.inner.send(buf, dest, tag)

    def isend(self, buf, dest, tag=0):
        self._count()
        return self.inner.isend(buf, dest, tag)
