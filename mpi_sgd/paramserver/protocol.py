"""The messages between workers and servers, and waiting for them without ever waiting forever.

Every message is a buffer; its tag says what it is and a probe tells its sender and length::

    worker -> server   HELLO   (empty)           send me the parameters
                       PUSH    gradient slice     apply this; it was computed on what you sent me last
                       DONE    (empty)           server 0 stopped me; I will push no more
                       WAITING (empty)           another server keeps me waiting (it sent me a HOLD):
                                                 I am alive, and compute nothing until it answers
    server -> worker   PARAMS  parameter slice    the new parameters: compute on
                       STOP    parameter slice    (server 0) every gradient of the budget is in: push no more
                       HOLD    (empty)           you are kept waiting, and I am alive
                       FINAL   parameter slice    training is over: the final parameters
                       FINAL_LOST                 the same, and a rank was lost on the way
    server 0 -> server COLLECT (empty)           after training: send me your results
    server -> server 0 SHARD, STATS, SNAPSHOTS    your final slice, counts, kept versions

No message carries a version: each server remembers which version it sent each worker, which is
all it needs to measure staleness. Waits are polls of ``iprobe``/``test`` with a deadline, never
a blocking call, because a blocking MPI call to a rank that has died may never return. Between
polls a rank first spins briefly (a reply usually comes within microseconds) and then sleeps,
so a waiting rank leaves its core to ranks that compute.
"""

from __future__ import annotations

import time

from ..comm.polling import wait_idle

HELLO, PUSH, DONE, WAITING = 7001, 7002, 7003, 7004
PARAMS, STOP, HOLD, FINAL, FINAL_LOST = 7011, 7012, 7013, 7014, 7015
SHARD, STATS, SNAPSHOT_VERSIONS, SNAPSHOTS = 7021, 7022, 7023, 7024
COLLECT = 7031
NAMES = {
    HELLO: "HELLO",
    PUSH: "PUSH",
    DONE: "DONE",
    WAITING: "WAITING",
    PARAMS: "PARAMS",
    STOP: "STOP",
    HOLD: "HOLD",
    FINAL: "FINAL",
    FINAL_LOST: "FINAL_LOST",
    SHARD: "SHARD",
    STATS: "STATS",
    SNAPSHOT_VERSIONS: "SNAPSHOT_VERSIONS",
    SNAPSHOTS: "SNAPSHOTS",
    COLLECT: "COLLECT",
}


class ServerLost(RuntimeError):
    """A worker heard nothing from a server for longer than the server timeout."""


class ProtocolError(RuntimeError):
    """A message that cannot be right: an unknown tag, a wrong length, a gradient that is not finite."""


def wait_until(request, deadline: float) -> bool:
    """Poll ``request`` until it completes (True), or fails or outlives ``deadline`` (False).

    It fails when the peer dies in the middle of the message: MPICH then reports an error (for
    example the single-copy read from the dead process), which mpi4py raises as a RuntimeError.
    """
    try:
        return wait_idle(request, deadline - time.monotonic())
    except RuntimeError:
        return False


def in_flight(request) -> bool:
    """Whether ``request`` is still under way (not complete, not failed); one poll."""
    try:
        return not request.test()
    except RuntimeError:
        return False
