"""Asynchronous SGD with a parameter server: workers that never wait for each other.

Of R ranks, ranks 0..k-1 are **servers**, each owning an even slice of the flat parameter
vector, and the other W = R - k are **workers**. A worker pulls the parameters, computes a
gradient on its own batch and pushes it, slice by slice; each server applies every push the
moment it arrives (``iprobe``/``recv`` from any source, on buffers, no pickle) and answers with
its new slice. There is no barrier and no collective in the loop, so a slow worker slows only
itself. The price is **staleness**: a gradient computed on version v is applied at version
V >= v, tau = V - v versions late (see :mod:`.staleness` for the bound and the staleness-aware
learning rate). With one worker tau is always 0 and the run is exactly plain SGD.

    result = paramserver.train(comm, model, dataset, AsyncConfig(servers=1, evaluations=2000))

Server 0 keeps the budget: exactly ``evaluations`` gradients are handed out and applied; then
every worker is told STOP and, once all have stopped, sent the final parameters. The protocol
is in :mod:`.protocol`, the loops in :mod:`.server` and :mod:`.worker`.

**What survives a failure.** Every wait is a poll with a deadline, never a blocking MPI call
that a dead peer could leave hanging:

* *A worker dies*: the servers hear nothing from it for ``worker_timeout`` seconds, report it
  ("lost worker rank 3"), hand its gradient to the others and finish the budget without it.
  A process that survives a lost rank leaves without ``MPI_Finalize``, which would wait for the
  lost rank forever, and the job's exit status is the dead rank's. (A worker that dies *after*
  taking the final parameters is not noticed: the others then wait for it in ``MPI_Finalize``
  until the launcher's ``MPIEXEC_TIMEOUT``.)
* *A server dies*: its workers hear nothing for ``server_timeout`` seconds (5 by default; a
  server keeping a worker waiting sends a HOLD every ``heartbeat`` seconds, so waiting is not
  silence), print which server is gone and ``MPI_Abort`` the job: it ends within about
  ``server_timeout`` plus one step. A worker passes the HOLDs of one server on to the others,
  so being kept waiting is not silence to them either (:mod:`.peers`).

What the launcher allows on top of that (MPICH 5's hydra ``mpiexec``; read in its proxy source
and checked here):

* By default hydra kills the whole job as soon as any rank exits without ``MPI_Finalize``: a
  dead worker then ends the job at once, as a dead server does. Launch with
  ``mpiexec -disable-auto-cleanup`` for the servers to carry on.
* Even so, hydra's proxy kills every rank when one is *killed by a signal* (``kill -9``, the OOM
  killer, a segfault), whatever the flag. What survives is a worker that *exits*: an exception
  (caught here: the worker prints it and exits 1 instead of aborting the job), ``sys.exit``,
  ``os._exit``.
* MPICH's own fault tolerance (``MPIR_CVAR_ENABLE_FT=1``, the ULFM calls such as
  ``MPI_Comm_get_failed``) fails an assertion in ``MPI_Init`` in the 5.0.2 wheel (ch4), so it is
  not used; nothing here depends on it.
* Open MPI's ``mpirun`` likewise aborts the job when a rank fails unless told otherwise
  (``--with-ft ulfm`` in builds with ULFM); not tested here.
"""

from .config import UNBOUNDED, AsyncConfig
from .protocol import ProtocolError, ServerLost
from .run import Result, mean_loss, train
from .staleness import histogram_text

__all__ = [
    "UNBOUNDED",
    "AsyncConfig",
    "ProtocolError",
    "Result",
    "ServerLost",
    "histogram_text",
    "mean_loss",
    "train",
]
