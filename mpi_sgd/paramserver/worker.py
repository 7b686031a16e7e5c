"""A worker: pull the parameters, compute a gradient on its own batch, push it; again.

The model's parameters are views into one flat buffer (:func:`.flat.flatten`), so each server's
reply is received straight into the model, and each gradient slice is pushed straight from where
backward put it. Worker ``i`` of ``W`` reads its share of every epoch's shuffled batches (the
partition the synchronous trainer uses at ``W`` ranks) and goes through its own epochs at its own
pace. After a push it waits for a reply from every server, with a deadline: no word from a server
for ``server_timeout`` seconds (a HOLD counts as a word) means the server is gone, and
:class:`~.protocol.ServerLost` says which. A HOLD from one server is passed on to the others
(WAITING): they hear nothing else from a worker kept waiting, and would take it for dead
(:mod:`.peers`).
"""

from __future__ import annotations

import time

import torch
from torch.nn import functional as F

from .. import data
from ..comm.polling import Backoff
from .flat import flatten
from .protocol import (
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
    ServerLost,
    in_flight,
    wait_until,
)


class Worker:
    def __init__(self, comm, model, dataset: data.Dataset, cfg, bounds: list[slice]):
        self.comm, self.model, self.dataset, self.cfg, self.bounds = comm, model, dataset, cfg, bounds
        self.servers = range(cfg.servers)
        self.index, self.workers = comm.rank - cfg.servers, cfg.workers(comm.size)
        self.params, self.grads = flatten(model)
        self.loss_fn = F.cross_entropy if dataset.classification else F.mse_loss
        self.empty = torch.empty(0, dtype=self.params.dtype)
        self.delay = cfg.straggler_ms / 1e3 if cfg.straggler(comm.size) == comm.rank else 0.0
        self.steps = 0  # gradients computed and pushed
        self.lost = False  # a server told us a rank was lost on the way
        self.held = False  # a server kept us waiting (sent a HOLD) in this round of replies
        self.notes: list = []  # WAITING messages in flight
        self._warm_up()

    def _warm_up(self) -> None:
        """One backward pass on one sample, so the first timed step does not pay for lazy set-up.

        In eval mode (no dropout: the random stream is left as it was), and the gradient is zeroed.
        """
        mode = self.model.training
        self.model.eval()
        self.loss_fn(self.model(self.dataset.x[:1]), self.dataset.y[:1]).backward()
        self.grads.zero_()
        self.model.train(mode)

    def run(self) -> None:
        hello = [self._post(self.empty, s, HELLO) for s in self.servers]
        stopped = self._replies((PARAMS, STOP))
        self._sent(hello)
        batches = self._batches()
        while not stopped:
            x, y = next(batches)
            self.grads.zero_()
            self.loss_fn(self.model(x), y).backward()
            if self.delay:
                time.sleep(self.delay)  # a slower machine: it finishes later and lends its core meanwhile
            pushes = [self._post(self.grads[self.bounds[s]], s, PUSH) for s in self.servers]
            stopped = self._replies((PARAMS, STOP))
            self._sent(pushes)
            self.steps += 1
        done = [self._post(self.empty, s, DONE) for s in self.servers if s not in stopped]
        self._replies((FINAL, FINAL_LOST))
        self._sent(done)

    def _batches(self):
        """This worker's share of each epoch's batches, epoch after epoch."""
        n, epoch = len(self.dataset), 0
        while True:
            for idx in data.rank_batches(n, self.index, self.workers, self.cfg.batch_size, epoch, self.cfg.seed):
                yield self.dataset.x[idx], self.dataset.y[idx]
            epoch += 1

    def _replies(self, expected: tuple[int, ...]) -> set[int]:
        """One reply from every server, its slice received into the model; the servers that said STOP."""
        stopped, training, self.held = set(), PARAMS in expected, False
        for s in self.servers:
            status = self._await(s, training)
            if status.tag not in expected:
                raise ProtocolError(
                    f"worker rank {self.comm.rank}: {NAMES.get(status.tag, status.tag)} from "
                    f"server rank {s}, expected {' or '.join(NAMES[t] for t in expected)}"
                )
            into = self.params[self.bounds[s]]
            if status.count != into.numel():
                raise ProtocolError(f"server rank {s} sent {status.count} values; its slice has {into.numel()}")
            if not wait_until(self.comm.irecv(into, s, status.tag), time.monotonic() + self.cfg.server_timeout):
                raise ServerLost(f"worker rank {self.comm.rank}: server rank {s} stopped in the middle of a message")
            stopped |= {s} if status.tag == STOP else set()
            self.lost |= status.tag == FINAL_LOST
        if self.held and not stopped:  # released: every server counts our silence from now, not from its reply
            self._waiting(self.servers)
        return stopped

    def _await(self, server: int, training: bool):
        """The next message from ``server``, past any HOLDs; ServerLost after ``server_timeout`` of silence.

        While ``training``, each HOLD is passed on to the other servers, which have answered our
        push (or will) and would otherwise wait for the next one in vain (:mod:`.peers`). Once
        stopped, every server holds us itself and nothing needs passing on.
        """
        timeout = self.cfg.server_timeout
        deadline, backoff = time.monotonic() + timeout, Backoff()
        while True:
            status = self.comm.iprobe(server, dtype=self.params.dtype)
            if status is None:
                if time.monotonic() > deadline:
                    raise ServerLost(
                        f"worker rank {self.comm.rank}: no word from server rank {server} for "
                        f"{timeout:g} s (--server-timeout): the server is gone"
                    )
                backoff.pause()
            elif status.tag == HOLD:  # kept waiting (staleness bound, budget): the server is alive
                self.comm.recv(self.empty, server, HOLD)
                deadline = time.monotonic() + timeout
                if training:
                    self.held = True
                    self._waiting([s for s in self.servers if s != server])
            else:
                return status

    def _waiting(self, servers) -> None:
        """Tell ``servers`` that we are, or were until now, kept waiting by a server: alive, not computing."""
        self.notes = [r for r in self.notes if in_flight(r)] + [self._post(self.empty, s, WAITING) for s in servers]

    def _post(self, buf, server: int, tag: int):
        try:
            return self.comm.isend(buf, server, tag)
        except RuntimeError as e:  # MPI reports the server's death (mpi4py's MPI.Exception)
            raise ServerLost(f"worker rank {self.comm.rank}: sending to server rank {server} failed: {e}") from None

    def _sent(self, requests) -> None:
        # Each server replied, so it has our message; these complete at once.
        deadline = time.monotonic() + self.cfg.server_timeout
        if not all(wait_until(r, deadline) for r in requests):
            raise ServerLost(f"worker rank {self.comm.rank}: a server did not take our message")
