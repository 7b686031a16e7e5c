"""The ``"mpi4py"`` torch process group: one method per torch call, each a non-blocking MPI call.

What the backend does and why is in :mod:`.torch_mpi4py`, which registers it. Every method checks
its arguments first (:mod:`.mpi4py_checks`), starts MPI's non-blocking form of the call on the
tensors' own memory and hands the requests to :func:`.progress.submit`, which returns the torch
``Work`` (:class:`~.mpi4py_work.MPIWork`) at once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.distributed as dist
from mpi4py import MPI

from . import mpitypes, progress
from .mpi4py_checks import GroupChecks, check, single, unsupported
from .mpi4py_work import MPIWork

NAME = "mpi4py"
# torch always passes its options object; this stands in for it when a method is called directly.
_DEFAULT = SimpleNamespace(reduceOp=dist.ReduceOp.SUM, rootRank=0)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two (contiguous) tensors share any byte of memory."""
    return a.data_ptr() < b.data_ptr() + mpitypes.nbytes(b) and b.data_ptr() < a.data_ptr() + mpitypes.nbytes(a)


class _Op(NamedTuple):
    """One started MPI operation: its requests, what to do once they are done, what to keep alive."""

    requests: list
    finish: Callable | None = None
    keep: object = None


class MPI4PyProcessGroup(GroupChecks, dist.ProcessGroup):
    """A torch process group over an ``mpi4py.MPI.Comm``; see :mod:`.torch_mpi4py`."""

    def __init__(self, comm: MPI.Comm, timeout: timedelta | None = None):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        self._timeout = timeout
        self._tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        progress.engine()  # start the thread now rather than inside the first collective

    def getBackendName(self) -> str:
        return NAME

    def shutdown(self) -> None:
        """torch's ``destroy_process_group`` calls this: the group's communicator goes back to MPI."""
        if self.comm != MPI.COMM_NULL:  # Free() leaves the handle null: twice is harmless
            self.comm.Free()

    def __repr__(self) -> str:
        return f"<MPI4PyProcessGroup rank={self._rank}/{self._size}>"

    def _submit(self, call: str, ops: list[_Op], result, opts=None, statuses: bool = False) -> MPIWork:
        """One torch Work for the operations of one call (several for the coalesced calls).

        ``opts.asyncOp`` False means torch will ``wait()`` on it at once: the caller's thread then
        completes it itself (see :mod:`.progress`). C++ callers (DDP) leave it True.
        """
        finishes = [op.finish for op in ops if op.finish is not None]

        def finish():
            for f in finishes:
                f()

        return progress.submit(
            f"{call} on rank {self._rank}",
            [r for op in ops for r in op.requests],
            result,
            finish if finishes else None,
            keep=[op.keep for op in ops],
            timeout=self._timeout,
            caller_waits=not getattr(opts, "asyncOp", True),
            statuses=statuses,
        )

    def _divide(self, name: str, t: torch.Tensor) -> Callable | None:
        """The finishing step of an average: MPI sums, then we divide in place."""
        return (lambda: t.div_(self._size)) if name == "avg" else None

    # -- reductions ---------------------------------------------------------------------------
    def _allreduce(self, t: torch.Tensor, reduce_op, call: str) -> _Op:  # t already checked
        name, op = self._op(reduce_op, t.dtype, call)
        return _Op([self.comm.Iallreduce(MPI.IN_PLACE, mpitypes.buffer(t), op)], self._divide(name, t))

    def allreduce(self, tensors, opts=_DEFAULT):
        t = single(tensors, "allreduce")
        return self._submit("allreduce", [self._allreduce(t, opts.reduceOp, "allreduce")], tensors, opts)

    def allreduce_coalesced(self, tensors, opts=_DEFAULT):
        for t in tensors:  # every check before the first request starts
            self._op(opts.reduceOp, check(t, "all_reduce_coalesced").dtype, "all_reduce_coalesced")
        # One request per tensor, all in flight at once: no flattening copy.
        ops = [self._allreduce(t, opts.reduceOp, "all_reduce_coalesced") for t in tensors]  # all checked above
        return self._submit("all_reduce_coalesced", ops, tensors, opts)

    def reduce(self, tensors, opts=_DEFAULT):
        t = single(tensors, "reduce")
        root = self._root(opts.rootRank, "reduce")
        name, op = self._op(opts.reduceOp, t.dtype, "reduce")
        if self._rank == root:
            started = _Op([self.comm.Ireduce(MPI.IN_PLACE, mpitypes.buffer(t), op, root)], self._divide(name, t))
        else:
            started = _Op([self.comm.Ireduce(mpitypes.buffer(t), None, op, root)])
        return self._submit("reduce", [started], tensors, opts)

    def _reduce_scatter_tensor(self, output, input, reduce_op, call: str) -> _Op:
        check(output, call), check(input, call)
        if input.numel() != output.numel() * self._size or input.dtype != output.dtype:
            raise ValueError(
                f"mpi4py backend: {call}: input must be {self._size} x output ({output.numel()} "
                f"elements of {output.dtype}), got {input.numel()} of {input.dtype}"
            )
        name, op = self._op(reduce_op, output.dtype, call)
        if _overlap(input, output):  # reduce_scatter_tensor(x[:n], x): MPI forbids aliased buffers
            input = input.clone()
        req = self.comm.Ireduce_scatter_block(mpitypes.buffer(input), mpitypes.buffer(output), op)
        return _Op([req], self._divide(name, output), keep=input)

    def reduce_scatter_single(self, output, input, opts=_DEFAULT):
        """``dist.reduce_scatter_tensor``: block ``rank`` of the reduction of ``input`` lands in ``output``."""
        call = "reduce_scatter_tensor"
        return self._submit(call, [self._reduce_scatter_tensor(output, input, opts.reduceOp, call)], [output], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=_DEFAULT):
        call = "reduce_scatter_tensor_coalesced"
        pairs = self._pairs(call, outputs, inputs)
        ops = [self._reduce_scatter_tensor(o, i, opts.reduceOp, call) for o, i in pairs]
        return self._submit(call, ops, outputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=_DEFAULT):
        out = single(output_tensors, "reduce_scatter")
        if len(input_tensors) != 1:
            raise unsupported("reduce_scatter", f"{len(input_tensors)} input lists")
        blocks = self._slots(input_tensors[0], out, "reduce_scatter")
        name, op = self._op(opts.reduceOp, out.dtype, "reduce_scatter")
        # MPI reads one buffer: the blocks themselves if they are back to back, else a copy of them.
        send = blocks[0] if mpitypes.adjacent(blocks) else torch.cat([b.reshape(-1) for b in blocks])
        span = mpitypes.buffer(send, length=mpitypes.nbytes(out) * self._size)
        req = self.comm.Ireduce_scatter_block(span, mpitypes.buffer(out), op)
        started = _Op([req], self._divide(name, out), keep=(send, blocks))
        return self._submit("reduce_scatter", [started], output_tensors, opts)

    # -- data movement ----------------------------------------------------------------------
    def broadcast(self, tensors, opts=_DEFAULT):
        t = single(tensors, "broadcast")
        req = self.comm.Ibcast(mpitypes.buffer(t), self._root(opts.rootRank, "broadcast"))
        return self._submit("broadcast", [_Op([req])], tensors, opts)

    def _allgather(self, slots, t: torch.Tensor, call: str) -> _Op:
        slots = self._slots(slots, check(t, call), call)
        if any(_overlap(t, s) for s in slots):  # one of the outputs (in place), or inside one: a copy
            t = t.clone()
        return _Op([self.comm.Iallgatherv(mpitypes.as_bytes(t), mpitypes.scattered(slots))], keep=t)

    def allgather(self, output_tensors, input_tensors, opts=_DEFAULT):
        t = single(input_tensors, "all_gather")
        if len(output_tensors) != 1:
            raise unsupported("all_gather", f"{len(output_tensors)} output lists")
        return self._submit("all_gather", [self._allgather(output_tensors[0], t, "all_gather")], output_tensors, opts)

    def allgather_coalesced(self, output_lists, input_tensors, opts=_DEFAULT):
        call = "all_gather_coalesced"
        pairs = self._pairs(call, output_lists, input_tensors)
        return self._submit(call, [self._allgather(o, i, call) for o, i in pairs], output_lists, opts)

    def _all_gather_tensor(self, output, input, call: str) -> _Op:
        check(output, call), check(input, call)
        if output.numel() != input.numel() * self._size or input.dtype != output.dtype:
            raise ValueError(
                f"mpi4py backend: {call}: output must be {self._size} x input ({input.numel()} "
                f"elements of {input.dtype}), got {output.numel()} of {output.dtype}"
            )
        if input.data_ptr() == output.data_ptr() + self._rank * mpitypes.nbytes(input):
            # all_gather_into_tensor(out, out.chunk(R)[rank]), as FSDP calls it: MPI's in-place form
            return _Op([self.comm.Iallgather(MPI.IN_PLACE, mpitypes.buffer(output))])
        if _overlap(input, output):  # aliased elsewhere in output: MPI forbids it, so from a copy
            input = input.clone()
        return _Op([self.comm.Iallgather(mpitypes.buffer(input), mpitypes.buffer(output))], keep=input)

    def all_gather_single(self, output, input, opts=_DEFAULT):
        """``dist.all_gather_into_tensor``: ``output`` gets every rank's ``input``, in rank order."""
        call = "all_gather_into_tensor"
        return self._submit(call, [self._all_gather_tensor(output, input, call)], [output], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=_DEFAULT):
        call = "all_gather_into_tensor_coalesced"
        pairs = self._pairs(call, outputs, inputs)
        return self._submit(call, [self._all_gather_tensor(o, i, call) for o, i in pairs], outputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=_DEFAULT):
        t = single(input_tensors, "gather")
        root = self._root(opts.rootRank, "gather")
        recv = None
        if self._rank == root:
            if len(output_tensors) != 1:
                raise unsupported("gather", f"{len(output_tensors)} output lists")
            recv = mpitypes.scattered(self._slots(output_tensors[0], t, "gather"))
        req = self.comm.Igatherv(mpitypes.as_bytes(t), recv, root)
        return self._submit("gather", [_Op([req])], output_tensors, opts)

    def scatter(self, output_tensors, input_tensors, opts=_DEFAULT):
        t = single(output_tensors, "scatter")
        root = self._root(opts.rootRank, "scatter")
        send = None
        if self._rank == root:
            if len(input_tensors) != 1:
                raise unsupported("scatter", f"{len(input_tensors)} input lists")
            send = mpitypes.scattered(self._slots(input_tensors[0], t, "scatter"))
        req = self.comm.Iscatterv(send, mpitypes.as_bytes(t), root)
        return self._submit("scatter", [_Op([req])], output_tensors, opts)

    def alltoall(self, output_tensors, input_tensors, opts=_DEFAULT):
        """``dist.all_to_all``: input ``j`` goes to rank ``j``, output ``i`` comes from rank ``i``;
        sizes may differ from one peer to the next (each pair must agree)."""
        for t in list(output_tensors) + list(input_tensors):
            check(t, "all_to_all")
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(f"mpi4py backend: all_to_all needs {self._size} input and output tensors")
        if len({t.dtype for t in list(output_tensors) + list(input_tensors)}) > 1:
            raise ValueError("mpi4py backend: all_to_all needs one dtype for every tensor")
        req = self.comm.Ialltoallv(mpitypes.scattered(input_tensors), mpitypes.scattered(output_tensors))
        return self._submit("all_to_all", [_Op([req])], output_tensors, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=_DEFAULT):
        """``dist.all_to_all_single``: rows of ``input`` cut by ``input_split_sizes`` (equal if empty)."""
        call = "all_to_all_single"
        check(output, call), check(input, call)
        if output.dtype != input.dtype:
            raise ValueError(f"mpi4py backend: {call}: input is {input.dtype} but output {output.dtype}")
        send = self._splits(input, input_split_sizes, call)
        recv = self._splits(output, output_split_sizes, call)
        return self._submit(call, [_Op([self.comm.Ialltoallv(send, recv)])], [output], opts)

    alltoall_base = all_to_all_single

    def _splits(self, t: torch.Tensor, splits, call: str) -> list:
        rows = t.shape[0] if t.dim() else 1
        splits = list(splits) or [rows // self._size] * self._size
        if len(splits) != self._size or sum(splits) != rows:
            raise ValueError(f"mpi4py backend: {call}: split sizes {splits} do not cut {rows} rows into {self._size}")
        row = mpitypes.nbytes(t) // max(rows, 1)
        counts = [s * row for s in splits]
        displs = [sum(counts[:i]) for i in range(self._size)]
        return [MPI.buffer.fromaddress(t.data_ptr(), mpitypes.nbytes(t)), counts, displs, MPI.BYTE]

    # -- point to point -----------------------------------------------------------------------
    def send(self, tensors, dstRank: int, tag: int):
        t = single(tensors, "send")
        req = self.comm.Isend(mpitypes.buffer(t), dstRank, self._tag(tag, "send"))
        return self._submit("send", [_Op([req])], tensors)

    def recv(self, tensors, srcRank: int, tag: int):
        t = single(tensors, "recv")
        req = self.comm.Irecv(mpitypes.buffer(t), srcRank, self._tag(tag, "recv"))
        return self._submit("recv", [_Op([req])], tensors)

    def recv_anysource(self, tensors, tag: int):
        t = single(tensors, "recv")
        req = self.comm.Irecv(mpitypes.buffer(t), MPI.ANY_SOURCE, self._tag(tag, "recv"))
        return self._submit("recv", [_Op([req])], tensors, statuses=True)  # the status names the sender

    def barrier(self, opts=_DEFAULT):
        return self._submit("barrier", [_Op([self.comm.Ibarrier()])], [], opts)
