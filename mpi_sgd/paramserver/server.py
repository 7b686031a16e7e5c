"""A server: owns one slice of the parameters and applies every push the moment it can.

The loop asks MPI for the next message from any worker (``iprobe``), receives it into that
worker's own buffer, and answers it; nothing waits for anyone else, and there is no barrier.
Server 0 (the *lead*) also keeps the budget (:mod:`.budget`): it hands out exactly
``evaluations`` gradients in all, holds the workers that ask for more while another still owes
one, and stops them once every gradient is applied. Each server applies gradients to its slice with
the update ``torch.optim.SGD`` makes (:mod:`.update`), so with one worker the arithmetic is exactly
plain SGD's.

Failure handling, as this server sees it:

* a worker that sends nothing for ``worker_timeout`` seconds while it owes a push is *lost*:
  it is reported, its unapplied gradient (if any) is dropped and handed out again, and it no
  longer counts for bounded staleness. A lost worker that speaks again is told STOP. A worker
  that another server keeps waiting says so (WAITING), and is not silent (:mod:`.peers`).
* a worker kept waiting (by bounded staleness, by the budget, or stopped until every other
  worker is) gets a HOLD every ``heartbeat`` seconds, so it can tell a busy server from a dead one.
* a message that cannot be right (from a non-worker, of the wrong length, a gradient with NaN
  or infinity) raises :class:`~.protocol.ProtocolError`: garbage is not trained on.

One class, kept whole: its message handlers all read and change the same per-worker state, and
split apart they would pass that state around instead. What needs none of the rest lives beside
it: the budget's arithmetic in :mod:`.budget`, one worker's state and when its silence means it
is lost in :mod:`.peers`, the update rule in :mod:`.update`, the results sent to server 0 after
training in :mod:`.results`.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import torch

from ..comm.polling import Backoff
from . import results
from .budget import Budget
from .peers import COMPUTING, FINISHED, HELD, LOST, NEW, PENDING, SERVING, Peer
from .protocol import (
    COLLECT,
    DONE,
    FINAL,
    FINAL_LOST,
    HELLO,
    HOLD,
    NAMES,
    PARAMS,
    PUSH,
    STOP,
    WAITING,
    ProtocolError,
    in_flight,
    wait_until,
)
from .staleness import Clock, staleness_lr
from .update import MomentumSGD


class Server:
    def __init__(self, comm, params: torch.Tensor, cfg, index: int, bounds: list[slice]):
        self.comm, self.cfg, self.index, self.bounds = comm, cfg, index, bounds
        self.lead = index == 0
        self.shard = params[bounds[index]].detach().clone()
        self.update = MomentumSGD(cfg.momentum)
        self.clock = Clock(cfg.max_staleness if cfg.bounded else None)
        self.t0 = time.monotonic()
        self.peers = {r: Peer(r, self.shard, self.t0) for r in range(cfg.servers, comm.size)}
        self.empty = torch.empty(0, dtype=self.shard.dtype)
        self.budget = Budget(cfg.evaluations) if self.lead else None
        self.staleness: Counter = Counter()
        self.applied_by: Counter = Counter()
        self.lost: dict[int, str] = {}
        self.snapshots: list[tuple[int, float, torch.Tensor]] = []
        self.notes: list = []  # HOLD messages in flight
        self.collect = False  # server 0 asked for the results (other servers)
        self.seconds = 0.0

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        self.t0 = last_watch = time.monotonic()
        for peer in self.peers.values():
            peer.since = peer.noted = self.t0
        if cfg.snapshot_every:
            self._snapshot()
        backoff = Backoff()
        while any(p.state in SERVING for p in self.peers.values()):
            status = self.comm.iprobe(dtype=self.shard.dtype)
            now = time.monotonic()
            if now - last_watch > min(0.05, cfg.heartbeat / 4):
                self._watch(now)
                last_watch = now
            if status is None:
                backoff.pause()
                continue
            backoff.reset()
            self._handle(status)
        self.seconds = time.monotonic() - self.t0
        self._finish()

    def _handle(self, status) -> None:
        peer = self.peers.get(status.source)
        if peer is None:
            if status.tag == COLLECT and not self.lead:
                self._recv(status.source, self.empty, COLLECT, self.cfg.server_timeout)
                self.collect = True
                return
            raise ProtocolError(
                f"server rank {self.comm.rank}: {NAMES.get(status.tag, status.tag)} from rank "
                f"{status.source}, which is not a worker"
            )
        if status.tag == PUSH:
            self._push(peer, status.count)
        elif status.tag in (HELLO, DONE, WAITING):
            self._recv(peer.rank, self.empty, status.tag, self.cfg.worker_timeout)
            if status.tag == HELLO:
                self._hello(peer)
            elif status.tag == DONE:
                self._done(peer)
            else:  # another server keeps it (or kept it until now) waiting: alive, not silent (.peers)
                peer.waiting(time.monotonic())
        else:
            raise ProtocolError(f"server rank {self.comm.rank}: unknown tag {status.tag} from rank {peer.rank}")

    def _hello(self, peer: Peer) -> None:
        if peer.state == LOST:
            return self._revived(peer)
        self._expect(peer, NEW, "HELLO")
        self._reply(peer)

    def _push(self, peer: Peer, count: int) -> None:
        if count != self.shard.numel():
            raise ProtocolError(
                f"rank {peer.rank} pushed {count} values to server rank {self.comm.rank}, which "
                f"owns {self.shard.numel()}: the ranks disagree on the model"
            )
        if not self._recv(peer.rank, peer.grad, PUSH, self.cfg.worker_timeout):
            return self._lose(peer, f"its push stopped arriving for {self.cfg.worker_timeout:g} s")
        if peer.state == LOST:
            return self._revived(peer)
        self._expect(peer, COMPUTING, "a gradient")
        bad = (~torch.isfinite(peer.grad)).sum().item()
        if bad:
            raise ProtocolError(
                f"rank {peer.rank} pushed a gradient with {bad} NaN or infinite values: not "
                "applied. Training diverged? Try a lower --lr"
            )
        peer.state = PENDING
        peer.noted = time.monotonic()
        self._apply_ready()

    def _done(self, peer: Peer) -> None:
        if peer.state == LOST:
            return
        self._expect(peer, COMPUTING, "DONE")
        self._retire(peer, FINISHED)

    def _expect(self, peer: Peer, state: str, what: str) -> None:
        if peer.state != state:
            raise ProtocolError(f"server rank {self.comm.rank}: {what} from rank {peer.rank}, which is {peer.state}")

    # -- applying -------------------------------------------------------------------------------
    def _apply_ready(self) -> None:
        """Apply held pushes, oldest first, for as long as the staleness bound allows."""
        while True:
            pending = sorted(
                (self.clock.outstanding[p.rank], p.rank) for p in self.peers.values() if p.state == PENDING
            )
            continues = not self.lead or self.budget.open
            rank = next((r for _, r in pending if self.clock.may_apply(r, continues)), None)
            if rank is None:
                return
            self._apply(self.peers[rank])

    def _apply(self, peer: Peer) -> None:
        tau = self.clock.apply(peer.rank)
        self.update.step(self.shard, peer.grad, staleness_lr(self.cfg.lr, tau, self.cfg.lr_by_staleness))
        self.staleness[tau] += 1
        self.applied_by[peer.rank] += 1
        if self.cfg.snapshot_every and self.clock.version % self.cfg.snapshot_every == 0:
            self._snapshot()
        if self.lead:
            self.budget.apply(peer.rank)
        self._reply(peer)
        self._settle()  # the last gradient owed is in: the held workers stop

    def _reply(self, peer: Peer) -> None:
        """Send ``peer`` the current slice to compute on; server 0 may hold or stop it instead."""
        self._answer(peer, self.budget.ask(peer.rank) if self.lead else PARAMS)

    def _answer(self, peer: Peer, tag: int) -> None:
        if tag == HOLD:  # said at once, for it to tell the other servers (.peers); _settle sends the answer
            peer.state, peer.noted = HELD, time.monotonic()
            self.notes.append(self._post(self.empty, peer.rank, HOLD))
            return
        if tag == PARAMS:
            self.clock.hand_out(peer.rank)
            peer.state = COMPUTING
        else:
            peer.state = FINISHED
        self._send(peer, tag, self.shard)

    def _settle(self) -> None:
        """(server 0) Answer the held workers whose answer the budget now knows."""
        if self.lead:
            for rank, tag in self.budget.settle():
                self._answer(self.peers[rank], tag)

    def _send(self, peer: Peer, tag: int, data: torch.Tensor | None) -> None:
        # The worker spoke after receiving our last message, so that send has completed and this
        # returns at once; only a worker that died with it half-received makes it time out.
        if peer.sending is not None and not wait_until(peer.sending, time.monotonic() + self.cfg.worker_timeout):
            return self._lose(peer, "it stopped taking our messages")
        buf = self.empty
        if data is not None:
            peer.reply.copy_(data)
            buf = peer.reply
        peer.sending = self._post(buf, peer.rank, tag)
        if peer.sending is None:
            return self._lose(peer, "sending to it failed")
        peer.since = peer.noted = time.monotonic()

    def _post(self, buf, rank: int, tag: int):
        """``isend``, or None where MPI reports the peer's death (mpi4py raises it as a RuntimeError)."""
        try:
            return self.comm.isend(buf, rank, tag)
        except RuntimeError:
            return None

    # -- failures -------------------------------------------------------------------------------
    def _watch(self, now: float) -> None:
        for peer in self.peers.values():
            due = peer.due(now, self.cfg.worker_timeout, self.cfg.heartbeat)
            if due == LOST:
                self._lose(
                    peer, f"sent nothing for {now - peer.since:.1f} s (--worker-timeout {self.cfg.worker_timeout:g})"
                )
            elif due == HOLD:
                # kept waiting: for the staleness bound, the budget, or (stopped) the others to finish
                self.notes.append(self._post(self.empty, peer.rank, HOLD))
                peer.noted = now
        self.notes = [r for r in self.notes if r is not None and in_flight(r)]

    def _lose(self, peer: Peer, why: str) -> None:
        self.lost[peer.rank] = why
        print(
            f"server rank {self.comm.rank}: lost worker rank {peer.rank}: {why}; carrying on with "
            f"{sum(p.state not in (LOST, FINISHED) for p in self.peers.values() if p is not peer)} worker(s)",
            file=sys.stderr,
            flush=True,
        )
        self._retire(peer, LOST)

    def _retire(self, peer: Peer, state: str) -> None:
        if self.lead:
            self.budget.drop(peer.rank)  # a gradient it owed was never applied: a held worker computes it
        peer.state = state
        self.clock.retire(peer.rank)
        self._settle()
        self._apply_ready()  # it may have been the one others waited for

    def _revived(self, peer: Peer) -> None:
        """A worker given up for lost speaks again: tell it to stop; it is no longer counted on."""
        print(
            f"server rank {self.comm.rank}: worker rank {peer.rank}, given up for lost, spoke again: stopped",
            file=sys.stderr,
            flush=True,
        )
        self.lost.pop(peer.rank, None)
        peer.state = FINISHED
        self._send(peer, STOP, self.shard)

    # -- the end --------------------------------------------------------------------------------
    def _snapshot(self) -> None:
        self.snapshots.append((self.clock.version, time.monotonic() - self.t0, self.shard.clone()))

    def _finish(self) -> None:
        """Send every worker still there the final parameters; the other servers report to server 0."""
        cfg = self.cfg
        finished = [p for p in self.peers.values() if p.state == FINISHED]
        for peer in finished:
            self._send(peer, FINAL_LOST if self.lost else FINAL, self.shard)
        deadline = time.monotonic() + cfg.server_timeout
        for peer in finished:
            if peer.state == FINISHED and not wait_until(peer.sending, deadline):
                self._lose(peer, "it did not take the final parameters")
        if self.cfg.snapshot_every and self.snapshots[-1][0] != self.clock.version:
            self._snapshot()
        if not self.lead:
            results.send(self)

    def _recv(self, source: int, buf, tag: int, seconds: float) -> bool:
        """Receive a message a probe has seen; False if it stops arriving (its sender died mid-way)."""
        return wait_until(self.comm.irecv(buf, source, tag), time.monotonic() + seconds)
