"""All-reduce of buffers that live in a node-shared window (:mod:`.window`), without copying through MPI.

MPI's all-reduce between ranks of one host moves every byte through shared-memory cells: the
sender copies it in, the receiver copies it out, and then it is reduced; about two passes over
memory per byte more than the arithmetic needs. When the buffers themselves are shared, each of
the R ranks of a node can do its part in place (a reduce-scatter and an all-gather in one pass):

1. *arrive*: every rank's input is ready (it has called the all-reduce);
2. *reduce*: rank r owns the r-th of R slices (cut at cache-line boundaries). Chunk by chunk it
   adds every rank's copy of the chunk into its own, divides by R for "avg", and writes the result
   into every other rank's buffer while the chunk is still in its cache;
3. *done*: once every rank has pushed its slice, every buffer holds the whole result.

Below :data:`MIN_BYTES` a shared buffer goes to MPI's own all-reduce instead (it is ordinary memory
to MPI). There fixed costs decide, and MPI's C path for small messages costs less than two
synchronisations plus a dozen numpy calls from Python: even a variant with one synchronisation
(each rank stages a copy and sums them all itself) measured slower than MPICH at 4-32 KiB. But a
job's MPI path is not MPI alone: the seam first agrees every reduction across the ranks
(:mod:`~mpi_sgd.comm.wrappers.callcheck`, one small collective per call), which this path does
for itself in shared memory. Against MPI with that check, this path measured faster from 16 KiB
at 2, 3 and 4 ranks on 2 cores (against bare MPI: faster at 2 ranks, mixed when oversubscribed),
so 16 KiB is where it starts. Every rank takes the same path, since the size is the same on
every rank.

Per rank that is one read of every buffer's slice and one write of every buffer's slice: about
the traffic of one ``memcpy`` of the buffer, no copy-in and no copy-out. Chunking is what makes it
pay, and pushing (each owner writes its slice into every buffer) rather than pulling is what lets
the written data come from cache: see :mod:`.reduce`, which does the arithmetic.

**Hierarchical.** When the job spans nodes, step 2 writes the node's sum into node rank 0's buffer
only; the node leaders all-reduce it with MPI over their own communicator; each other rank then
copies the leader's result into its buffer, and the leader returns once they all have.

**Non-blocking.** :meth:`SharedAllreduce.iallreduce` only announces arrival. Its work happens when
this rank calls ``test()`` or ``wait()`` on any of its pending shared requests (or starts a blocking
one): calls advance strictly in the order they were started, as far as the other ranks allow. The
bucketed strategy's hooks call ``test()``, so a bucket that every rank has finished is reduced
during the rest of backward. There is no helper thread: the reduction is memory traffic this rank
has to do either way, and on a host with no idle core a thread would only take turns with backward
(and with the other ranks) for the same core; what polling gains is that no rank sits waiting for
a slower one while it still has backward work to do. Consequence: complete (``wait``) pending
shared requests before entering other blocking collectives on the same communicator, as the
strategies do; a rank that does not can stall its peers until the bounded wait names it.

The stages themselves, one step of one call at a time, are :mod:`.stages`; the arithmetic is in
:mod:`.reduce` and the waiting in :mod:`.sync`.
"""

from __future__ import annotations

from collections import deque

from mpi4py import MPI

from ..base import CommError, Request, check_op
from .reduce import OP_CODE, UFUNC, reduce_slice, slice_bounds
from .stages import DONE, Call, Stages
from .sync import ARRIVED, REDUCED, SLOTS, NodeSync
from .window import NodeMemory, _Segment

MIN_BYTES = 16 << 10  # smaller buffers take MPI's own all-reduce (see the module docstring)


class SharedAllreduce(Stages):
    """The all-reduce for buffers from :meth:`alloc`; flat on one node, hierarchical across nodes."""

    def __init__(self, comm: MPI.Comm, node_size: int | None = None, timeout: float | None = None):
        self.mem = NodeMemory(comm, node_size)
        self.sync = NodeSync(self.mem.node, self.mem.world_ranks, timeout, self.mem.host_ranks)
        self.world_size = comm.Get_size()
        self.flat = not self.mem.multi_node
        self.everyone = list(range(self.mem.size))
        self.others = [q for q in self.everyone if q != self.mem.rank]
        self.seq = 0
        self.pending: deque[Call] = deque()
        self.failed: BaseException | None = None
        self.min_bytes = MIN_BYTES  # the tests lower it to run the algorithm on every length

    def alloc(self, n: int, dtype=None):
        return self.mem.alloc(n, dtype)

    def find(self, buf):
        """Where ``buf`` lives if it is a shared buffer this all-reduce takes; None sends it to MPI."""
        nbytes = getattr(buf, "nbytes", 0)  # numpy arrays and torch tensors both have it
        return self.takes(self.mem.find(buf) if nbytes >= self.min_bytes else None)

    def takes(self, found):
        """``found`` (a place in the windows, from ``NodeMemory.find``) if this all-reduce takes it."""
        if found is not None and found[0].half is not None and not self.flat:
            return None  # 16-bit floats between nodes: MPI's user-defined ops, on the whole buffer
        return found

    # -- the seam's calls ---------------------------------------------------------------------
    def allreduce(self, found, op: str = "sum") -> None:
        seg = found[0]
        if (
            self.flat
            and not self.pending
            and self.failed is None
            and self.world_size > 1
            and op in UFUNC
            and (op != "avg" or seg.torch_dtype.is_floating_point)
        ):
            try:
                return self._flat_now(seg, found[1], found[2], op)
            except BaseException as e:
                self._fail(e)
        call = self._start(found, op)
        if call is None:
            return
        if len(self.pending) > 1:  # others in flight: they go first
            self._wait(call)
            return
        try:
            while call.stage != DONE:  # alone: straight through, no queue to walk
                waiting = self._step(call)
                if waiting is not None:
                    self.sync.spin(*waiting)
        except BaseException as e:
            self._fail(e)
        self.pending.clear()

    def _flat_now(self, seg: _Segment, lo: int, n: int, op: str) -> None:
        """The common case, a blocking call on one node with nothing in flight: the stages of
        :meth:`_step` straight through, with the same counters, fences and checks but no request,
        queue or flow control (every earlier call is complete here, and a flat call completes only
        once every rank has reduced it, so every rank has read every earlier descriptor). At 64 KiB
        the Python around the arithmetic is most of the time, which is why this path exists."""
        win, sync = seg.win, self.sync
        self.seq = seq = self.seq + 1
        desc = sync.post(seq, seg.id, lo, n * 8 + OP_CODE[op])
        win.Sync()  # the caller's data and the descriptor, before the arrival that publishes them
        sync.signal(ARRIVED, seq)
        sync.wait_for(ARRIVED, seq, self.others, "to start all-reduce")
        win.Sync()
        if sync.differs(seq, desc, self.others):
            self._check_descriptors(Call(seq, seg, lo, n, op))  # raises, naming both
        a, b = slice_bounds(n, self.mem.size, self.mem.rank, seg.dtype.itemsize)
        acc, sources = self._operands(seg, self.mem.rank)
        reduce_slice(acc, sources, lo + a, lo + b, op, True, self.world_size if op == "avg" else 1, seg.half)
        win.Sync()
        sync.signal(REDUCED, seq)
        sync.wait_for(REDUCED, seq, self.others, "to write their slices of all-reduce")
        win.Sync()

    def iallreduce(self, found, op: str, keep) -> Request:
        call = self._start(found, op)
        if call is None:
            return Request.completed()
        return Request(call, self._wait, self._test, keep=keep)

    def _fail(self, error: BaseException):
        # Ranks may have stopped half-way through a call: the counters can no longer be trusted.
        self.failed = error
        raise error

    def _start(self, found, op: str) -> Call | None:
        seg, lo, n = found
        if op not in UFUNC:
            check_op(op)  # raises, naming the valid ops
        if op == "avg" and not seg.torch_dtype.is_floating_point:
            raise TypeError(f"op 'avg' needs a floating dtype, got {seg.dtype}; use 'sum' and divide yourself")
        if self.failed is not None:
            raise CommError(f"an earlier shared-memory all-reduce on this communicator failed ({self.failed})")
        if self.world_size == 1:
            return None  # the buffer already holds the sum, and the average, over one rank
        try:
            return self._arrive(seg, lo, n, op)
        except BaseException as e:
            self._fail(e)

    def _arrive(self, seg: _Segment, lo: int, n: int, op: str) -> Call:
        sync = self.sync
        self.seq += 1
        seq = self.seq
        call = Call(seq, seg, lo, n, op)
        # Flow control: the descriptor slot about to be overwritten must have been read by every
        # rank, this one included, i.e. they all reduced the call that last used it.
        need = seq - SLOTS
        if need > 0 and sync.behind(REDUCED, need, self.everyone):
            self._until(lambda: sync.behind(REDUCED, need, self.everyone), "to catch up")
        sync.post(seq, seg.id, lo, n * 8 + OP_CODE[op])
        sync.fence(seg.win)  # the caller's data and the descriptor, before the arrival that publishes them
        sync.signal(ARRIVED, seq)
        self.pending.append(call)
        return call

    def _test(self, call: Call) -> bool:
        try:
            self._progress()
        except BaseException as e:
            self._fail(e)
        return call.stage == DONE

    def _wait(self, call: Call) -> None:
        try:
            while call.stage != DONE:
                blocked = self._progress()
                if blocked is not None:
                    self._until(*blocked)
        except BaseException as e:
            self._fail(e)

    def _until(self, missing, what: str) -> None:
        """Wait until ``missing()`` is empty, advancing pending calls meanwhile (so flow control cannot deadlock)."""

        def poll():
            self._progress()
            return missing()

        self.sync.spin(poll, what)

    # -- the engine ---------------------------------------------------------------------------
    def _progress(self):
        """Advance pending calls in order; a call never passes a stage its predecessor has not, so
        every counter grows one call at a time. Returns what the first stuck call waits for."""
        limit, blocked = DONE + 1, None
        for call in self.pending:
            while call.stage < limit and call.stage != DONE:
                waiting = self._step(call)
                if waiting is not None:
                    blocked = blocked or waiting
                    break
            limit = call.stage
        while self.pending and self.pending[0].stage == DONE:
            self.pending.popleft()
        return blocked

    def close(self) -> None:
        """Finish pending calls and free every window (collective)."""
        while self.pending:
            self._wait(self.pending[-1])
        self.sync.close()
        self.mem.close()
