"""One worker as one server sees it: what it is doing, and when its silence means it is dead.

A worker speaks only when it has something to say, so a server judges its silence by its state
(:meth:`Peer.due`):

* ``NEW`` or ``COMPUTING``: it owes this server a message (a HELLO, a push). Silent for
  ``worker_timeout`` seconds, it is *lost*.
* ``PENDING``, ``HELD`` (this server keeps it waiting) or ``FINISHED`` (stopped, waiting for the
  others): this server owes it an answer, and sends it a HOLD every ``heartbeat`` seconds so it
  can tell a busy server from a dead one.
* ``LOST``: given up on.

With several servers one of them may keep a worker waiting while another, which has answered its
push, sees it ``COMPUTING``: server 0 holds it for the budget, or one server's staleness bound
keeps its push pending. The worker sends nothing to the others meanwhile, since it computes
nothing until every server has answered. So it passes each HOLD it gets on to the other servers
(``WAITING``), and once answered tells every server the same again; :meth:`Peer.waiting` starts
its silence afresh. Server 0 sends its first HOLD the moment it holds a worker, so a worker held
for the budget is never silent toward any server for longer than a heartbeat (plus one period of
the server's watch) while held, nor for longer than its own step after: alive and merely held,
it is never declared lost, and a dead one stops passing HOLDs on and is lost as before. Hence
the heartbeat must be shorter than the worker timeout. (A staleness bound's wait shorter than a
heartbeat brings no HOLD: the other servers then see that wait plus one step of silence.)
"""

from __future__ import annotations

import torch

from ..comm.buffers import zeros
from .protocol import HOLD

NEW, COMPUTING, PENDING, HELD, FINISHED, LOST = "new", "computing", "pending", "held", "finished", "lost"
SERVING = (NEW, COMPUTING, PENDING, HELD)  # a server serves while any worker is in one of these


class Peer:
    def __init__(self, rank: int, like: torch.Tensor, now: float):
        self.rank, self.state = rank, NEW
        self.since = now  # when its silence began: we sent it something, or it said it waits elsewhere
        self.noted = now  # when we last sent it anything (a HOLD is due a heartbeat later)
        self.grad = zeros(like.numel(), like.dtype)  # its pushes land here
        self.reply = zeros(like.numel(), like.dtype)  # a copy of the slice it is sent, stable while in flight
        self.sending = None

    def waiting(self, now: float) -> None:
        """It says another server keeps it waiting: it is alive, and owes us nothing until it is answered."""
        if self.state == COMPUTING:
            self.since = now

    def due(self, now: float, worker_timeout: float, heartbeat: float) -> str | None:
        """What its silence calls for now: ``LOST``, a ``HOLD`` to send it, or None."""
        if self.state in (NEW, COMPUTING) and now - self.since > worker_timeout:
            return LOST
        if self.state in (PENDING, HELD, FINISHED) and now - self.noted >= heartbeat:
            return HOLD
        return None
