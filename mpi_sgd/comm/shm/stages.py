"""One shared all-reduce's way through its stages, one step at a time (see :mod:`.allreduce`).

A call *arrives* (its descriptor posted, its counter signalled), then is *reduced* (this rank's
slice of every node buffer), and on one node is *done* once every rank has pushed its slice.
Across nodes the node leader then all-reduces the node's sum with the other leaders over MPI
(*ready*), and every other rank *copies* the leader's result. :meth:`Stages._step` takes one call
one stage further when the other ranks allow it, and otherwise says whom it waits for; the
queue of calls, and when steps are taken, is :class:`~.allreduce.SharedAllreduce`'s.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..base import CollectiveMismatchError
from .reduce import MPI_OP, OP_NAMES, reduce_slice, slice_bounds
from .sync import ARRIVED, COPIED, READY, REDUCED, NodeSync
from .window import NodeMemory, _Segment

DONE = 99


def _describe(desc: list[int]) -> str:
    return f"buffer #{desc[1]} from element {desc[2]}, {desc[3] // 8} elements, op {OP_NAMES[desc[3] % 8]}"


class Call:
    """One all-reduce on its way through the stages (``stage`` is the last counter it signalled)."""

    __slots__ = ("seq", "seg", "lo", "n", "op", "stage", "request")

    def __init__(self, seq: int, seg: _Segment, lo: int, n: int, op: str):
        self.seq, self.seg, self.lo, self.n, self.op = seq, seg, lo, n, op
        self.stage, self.request = ARRIVED, None


class Stages:
    """The stages, for :class:`~.allreduce.SharedAllreduce`, which sets what they read: its node's
    memory and counters (``mem``, ``sync``), whether the job is on one node (``flat``), the other
    node ranks (``others``) and the job's size (``world_size``)."""

    mem: NodeMemory
    sync: NodeSync
    flat: bool
    others: list[int]
    world_size: int

    def _step(self, call: Call):
        """Do the next stage of ``call`` if the other ranks allow; else return ``(missing, what)``."""
        mem, sync, seq, seg = self.mem, self.sync, call.seq, call.seg
        leader = mem.rank == 0
        if call.stage == ARRIVED:
            if sync.behind(ARRIVED, seq, self.others):
                return self._waiting(ARRIVED, seq, self.others, f"to start all-reduce #{seq}")
            sync.fence(seg.win)  # what the others wrote before arriving (descriptors, data) is visible from here
            self._check_descriptors(call)
            self._reduce(call, push=self.flat)
            sync.fence(seg.win)  # our reads and writes are over before we say so
            sync.signal(REDUCED, seq)
            call.stage = REDUCED
        elif call.stage == REDUCED and self.flat:
            if sync.behind(REDUCED, seq, self.others):
                return self._waiting(REDUCED, seq, self.others, f"to write their slices of all-reduce #{seq}")
            sync.fence(seg.win)
            call.stage = DONE
        elif call.stage == REDUCED and leader:
            if sync.behind(REDUCED, seq, self.others):
                return self._waiting(REDUCED, seq, self.others, f"to reduce their slices of all-reduce #{seq}")
            sync.fence(seg.win)
            mine = seg.views[0][call.lo : call.lo + call.n]
            call.request = mem.leaders.Iallreduce(MPI.IN_PLACE, mine, MPI_OP[call.op])
            call.stage = READY
        elif call.stage == READY and leader:
            if not call.request.Test():
                # Testing drives MPI's progress; a completed request tests true again (it is null by then).
                return (lambda: [] if call.request.Test() else mem.other_leaders), (
                    f"(the other nodes' leaders) in all-reduce #{seq}, MPI between nodes"
                )
            if call.op == "avg":
                mine = seg.views[0][call.lo : call.lo + call.n]
                np.divide(mine, self.world_size, out=mine)
            sync.fence(seg.win)
            sync.signal(READY, seq)
            call.stage = COPIED if self.others else DONE
        elif call.stage == COPIED and leader:
            if sync.behind(COPIED, seq, self.others):
                return self._waiting(COPIED, seq, self.others, f"to copy the result of all-reduce #{seq}")
            sync.fence(seg.win)
            call.stage = DONE
        else:  # a non-leader of a multi-node job, after reducing: fetch the leader's result
            if sync.behind(READY, seq, [0]):
                return self._waiting(READY, seq, [0], f"(its node leader) to finish all-reduce #{seq}")
            sync.fence(seg.win)
            a, b = call.lo, call.lo + call.n
            np.copyto(seg.views[mem.rank][a:b], seg.views[0][a:b])
            sync.fence(seg.win)
            sync.signal(COPIED, seq)
            call.stage = DONE
        return None

    def _waiting(self, counter: int, seq: int, ranks, what: str):
        return (lambda: self.sync.behind(counter, seq, ranks)), what

    def _check_descriptors(self, call: Call) -> None:
        """Every rank must have passed the same window, offset, length and op: else it would reduce garbage."""
        mem, mine = self.mem, self.sync.descriptor(call.seq, self.mem.rank)
        for q in self.others:
            theirs = self.sync.descriptor(call.seq, q)
            if theirs != mine:
                me, them = mem.world_ranks[mem.rank], mem.world_ranks[q]
                raise CollectiveMismatchError(
                    f"ranks passed different shared buffers to all-reduce #{call.seq}: "
                    f"rank {me} {_describe(mine)}, rank {them} {_describe(theirs)}"
                )

    def _reduce(self, call: Call, push: bool) -> None:
        """This rank's slice of every node buffer, reduced into its own buffer and pushed into every
        other (flat), or reduced into the node leader's (across nodes, where the leader divides)."""
        a, b = slice_bounds(call.n, self.mem.size, self.mem.rank, call.seg.dtype.itemsize)
        acc, sources = self._operands(call.seg, self.mem.rank if push else 0)
        divide_by = self.world_size if call.op == "avg" and push else 1
        reduce_slice(acc, sources, call.lo + a, call.lo + b, call.op, push, divide_by, call.seg.half)

    def _operands(self, seg: _Segment, target: int) -> tuple:
        """``target``'s view of ``seg`` and the other node ranks' in rank order (the summation order)."""
        found = seg.operands.get(target)
        if found is None:
            views = seg.views
            found = seg.operands[target] = (views[target], [v for q, v in enumerate(views) if q != target])
        return found
