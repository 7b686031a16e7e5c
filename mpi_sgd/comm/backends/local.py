"""World size 1 without MPI: what ``python script.py`` gets.

Every collective over one rank is a copy or nothing at all, so this backend needs no MPI
library and works on any device. It keeps the seam's contracts exactly (in place, ``recvbuf``
shapes, "avg" only on floating dtypes) so that code tested here behaves the same under mpiexec.
Messages a rank sends to itself are buffered, as an MPI eager send to self would be.
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque

from ..base import (
    ANY_SOURCE,
    ANY_TAG,
    CommError,
    Communicator,
    Request,
    Status,
    check_avg,
    check_op,
    element_count,
    split_counts,
)


def _check_rank(peer: int, what: str) -> None:
    if peer != 0:
        raise CommError(f"{what} rank {peer} does not exist in a world of size 1")


class Loopback:
    """Messages from a rank to itself, matched by tag in order, as MPI matches them.

    A send finding a posted receive fills it; otherwise a copy waits in the mailbox (the sender
    may reuse its buffer at once). Waiting on a receive nothing will ever fill raises instead
    of hanging. Backends that cannot message their own rank (gloo) route self-messages here.
    """

    def __init__(self):
        self._mailbox: dict[int, deque] = defaultdict(deque)  # tag -> (send order, sent copy)
        self._waiting: dict[int, deque] = defaultdict(deque)  # tag -> posted receives
        self._order = itertools.count()  # so a probe for any tag finds the oldest message

    def isend(self, buf, tag: int) -> Request:
        if self._waiting[tag]:
            self._waiting[tag].popleft()[...] = buf
        else:
            self._mailbox[tag].append((next(self._order), buf.clone() if hasattr(buf, "clone") else buf.copy()))
        return Request.completed()

    def irecv(self, buf, tag: int) -> Request:
        if self._mailbox[tag]:
            buf[...] = self._mailbox[tag].popleft()[1]
            return Request.completed()
        self._waiting[tag].append(buf)

        def pending(_) -> bool:
            return any(b is buf for b in self._waiting[tag])

        def wait(handle):
            if pending(handle):
                raise CommError(f"receive from self (tag {tag}) has no matching send: it would wait forever")

        return Request(None, wait, lambda h: not pending(h))

    def iprobe(self, tag: int, dtype) -> Status | None:
        """The oldest message to self that a receive with ``tag`` (or any tag) would match."""
        heads = [(q[0][0], t, q[0][1]) for t, q in self._mailbox.items() if q and tag in (ANY_TAG, t)]
        if not heads:
            return None
        _, found, buf = min(heads, key=lambda head: head[0])
        return Status(0, found, element_count(buf.nbytes, dtype))


class LocalComm(Communicator):
    backend = "local"

    def __init__(self):
        self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
        self._self = Loopback()

    # -- point to point (to self) ---------------------------------------------------------
    def isend(self, buf, dest, tag=0):
        _check_rank(dest, "destination")
        return self._self.isend(buf, tag)

    def irecv(self, buf, source, tag=0):
        _check_rank(source, "source")
        return self._self.irecv(buf, tag)

    def send(self, buf, dest, tag=0):
        self.isend(buf, dest, tag)

    def iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, dtype=None):
        if source != ANY_SOURCE:
            _check_rank(source, "source")
        return self._self.iprobe(tag, dtype)

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG, dtype=None):
        status = self.iprobe(source, tag, dtype)
        if status is None:  # one process: nobody else can ever send it
            raise CommError(f"probe for a message to self (tag {tag}) with none queued: it would wait forever")
        return status

    def recv(self, buf, source, tag=0):
        self.irecv(buf, source, tag).wait()
        return buf

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, buf, op="sum"):
        check_op(op)
        if op == "avg":
            check_avg(buf)
        return buf

    def iallreduce(self, buf, op="sum"):
        self.allreduce(buf, op)
        return Request.completed()

    def broadcast(self, buf, root=0):
        _check_rank(root, "root")
        return buf

    def reduce(self, buf, op="sum", root=0):
        _check_rank(root, "root")
        return self.allreduce(buf, op)

    def gather(self, sendbuf, recvbuf=None, root=0):
        _check_rank(root, "root")
        recvbuf[0] = sendbuf
        return recvbuf

    def allgather(self, sendbuf, recvbuf):
        recvbuf[0] = sendbuf
        return recvbuf

    def scatter(self, sendbuf, recvbuf, root=0):
        _check_rank(root, "root")
        recvbuf[...] = sendbuf[0]
        return recvbuf

    def reduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        self.allreduce(sendbuf, op)
        flat = sendbuf.reshape(-1)
        n = split_counts(flat.shape[0], 1)[0] if counts is None else list(counts)[0]
        recvbuf.reshape(-1)[...] = flat[:n]
        return recvbuf

    def barrier(self):
        pass

    def abort(self, code=1):
        raise SystemExit(code)

    # -- sub-communicators: of one rank, or none ------------------------------------------
    def split(self, color, key=None):
        self._agree_split(color, key)
        return None if color is None else LocalComm()  # a new context: its own messages to self

    def split_type(self, kind="node", key=None):
        self._agree_split_type(kind, key)
        return LocalComm()

    # -- objects --------------------------------------------------------------------------
    def bcast_obj(self, obj, root=0):
        _check_rank(root, "root")
        return obj

    def allgather_obj(self, obj):
        return [obj]
