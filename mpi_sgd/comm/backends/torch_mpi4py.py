"""torch.distributed over mpi4py: a process-group backend named ``"mpi4py"``.

::

    import mpi_sgd.comm.backends.torch_mpi4py  # registers the backend
    dist.init_process_group("mpi4py")  # under mpiexec: no MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE

after which ``dist.*``, ``DistributedDataParallel`` and ``ZeroRedundancyOptimizer`` run unchanged over
MPI, from a pip-installed torch (whose own ``"mpi"`` backend needs a source build). Importing the
module registers the backend and lets ``env://`` rendezvous through MPI (:mod:`.rendezvous`).

* **Zero-copy.** Every call hands MPI the tensors' own memory (address, byte length, datatype), as
  the mpi4py seam does. Lists of tensors that lie anywhere in memory (``dist.all_gather`` into
  separately allocated tensors, gather, scatter, all_to_all) go as one ``MPI_*v`` call whose
  displacements are the tensors' addresses relative to the lowest one, so they too are written in
  place. The one exception: ``reduce_scatter`` from a *list* whose tensors are not adjacent in
  memory copies them into one buffer first (MPI's reduce-scatter reads a single buffer).
* **Non-blocking.** Every call starts a non-blocking MPI operation and returns a torch ``Work``
  at once; ``async_op=False`` is torch calling ``wait()`` straight away. The progress threads of
  :mod:`.progress` complete the requests and the work's future; why threads, and what they cost,
  is explained there. DDP's buckets therefore overlap backward as they do over gloo or NCCL.
* **Groups.** The default group is a duplicate of ``MPI.COMM_WORLD`` (its messages never meet
  yours); ``dist.new_group(ranks, backend="mpi4py")`` is ``MPI_Comm_create_group`` over those ranks,
  called by the group's members only. torch's global ranks must be MPI's (they are under
  ``init_process_group("mpi4py")``; a mismatch is an error, not a wrong answer).
* **Ops.** sum, avg (a sum, then a division: MPI has no average), min, max, product, and the
  bitwise ops on integers; float16/bfloat16 as :mod:`.mpitypes` describes. ``PREMUL_SUM`` (NCCL's),
  lists of several tensors per call (the old one-process-many-GPUs form), sparse tensors and
  non-CPU tensors raise ``NotImplementedError`` naming the call.

The module is longer than most here because torch's process-group interface is that wide: one
method per torch call (and its coalesced and renamed variants), each a few lines. Splitting one
class across files would hide the one thing a reader wants to see, the whole interface.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.distributed as dist
from mpi4py import MPI

from . import mpitypes, progress, rendezvous

NAME = "mpi4py"
_R = dist.ReduceOp.RedOpType
# torch always passes its options object; this stands in for it when a method is called directly.
_DEFAULT = SimpleNamespace(reduceOp=dist.ReduceOp.SUM, rootRank=0)
_OP_NAMES = {
    _R.SUM: "sum",
    _R.AVG: "avg",
    _R.PRODUCT: "prod",
    _R.MIN: "min",
    _R.MAX: "max",
    _R.BAND: "band",
    _R.BOR: "bor",
    _R.BXOR: "bxor",
}


def _unsupported(call: str, what: str) -> NotImplementedError:
    return NotImplementedError(f"mpi4py backend: {call} does not support {what}")


def _check(t: torch.Tensor, call: str) -> torch.Tensor:
    """Refuse, before any communication, what MPI cannot be handed as it is."""
    if t.layout != torch.strided:
        raise _unsupported(call, f"{t.layout} tensors")
    if t.device.type != "cpu":
        raise _unsupported(call, f"tensors on {t.device}; use the nccl backend for GPU tensors")
    if not t.is_contiguous():
        raise ValueError(f"mpi4py backend: {call} needs contiguous tensors, got strides {t.stride()}")
    if mpitypes.datatype(t.dtype) is None:
        raise _unsupported(call, f"dtype {t.dtype}")
    return t


def _single(tensors, call: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise _unsupported(call, f"{len(tensors)} tensors in one call (one tensor per process)")
    return _check(tensors[0], call)


class _Op(NamedTuple):
    """One started MPI operation: its requests, what to do once they are done, what to keep alive."""

    requests: list
    finish: Callable | None = None
    keep: object = None


class MPI4PyProcessGroup(dist.ProcessGroup):
    """A torch process group over an ``mpi4py.MPI.Comm``; see the module docstring."""

    def __init__(self, comm: MPI.Comm, timeout: timedelta | None = None):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        self._timeout = timeout
        self._tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        progress.engine()  # start the thread now rather than inside the first collective

    def getBackendName(self) -> str:
        return NAME

    def __repr__(self) -> str:
        return f"<MPI4PyProcessGroup rank={self._rank}/{self._size}>"

    def _submit(self, call: str, ops: list[_Op], result, opts=None, statuses: bool = False) -> progress.MPIWork:
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

    # -- checks, before any communication ------------------------------------------------------
    def _op(self, reduce_op, dtype: torch.dtype, call: str) -> tuple[str, MPI.Op]:
        kind = getattr(reduce_op, "op", reduce_op)
        name = _OP_NAMES.get(kind)
        if name is None:
            raise _unsupported(call, f"reduce op {kind}")
        if name == "avg" and not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"mpi4py backend: {call} with AVG needs a floating dtype, got {dtype}")
        try:
            return name, mpitypes.reduce_op(name, dtype)
        except TypeError as e:
            raise TypeError(f"mpi4py backend: {call}: {e}") from None

    def _divide(self, name: str, t: torch.Tensor) -> Callable | None:
        """The finishing step of an average: MPI sums, then we divide in place."""
        return (lambda: t.div_(self._size)) if name == "avg" else None

    def _slots(self, slots, like: torch.Tensor, call: str) -> list:
        """The per-rank tensors of gather/allgather/scatter: one per rank, each like ``like``."""
        if len(slots) != self._size:
            raise ValueError(f"mpi4py backend: {call} needs {self._size} tensors (one per rank), got {len(slots)}")
        for s in slots:
            _check(s, call)
            if s.dtype != like.dtype or s.numel() != like.numel():
                raise ValueError(
                    f"mpi4py backend: {call}: every tensor must have {like.numel()} elements of {like.dtype}, "
                    f"got {s.numel()} of {s.dtype}"
                )
        return list(slots)

    def _root(self, root: int, call: str) -> int:
        if not 0 <= root < self._size:
            raise ValueError(f"mpi4py backend: {call}: root {root} is not a rank of this group of {self._size}")
        return root

    def _tag(self, tag: int, call: str) -> int:
        if not 0 <= tag <= self._tag_ub:
            raise ValueError(f"mpi4py backend: {call}: tag {tag} outside MPI's range 0..{self._tag_ub}")
        return tag

    @staticmethod
    def _pairs(call: str, outputs, inputs) -> list:
        if len(outputs) != len(inputs):
            raise ValueError(f"mpi4py backend: {call}: {len(outputs)} outputs for {len(inputs)} inputs")
        return list(zip(outputs, inputs, strict=True))

    # -- reductions ---------------------------------------------------------------------------
    def _allreduce(self, t: torch.Tensor, reduce_op, call: str) -> _Op:  # t already checked
        name, op = self._op(reduce_op, t.dtype, call)
        return _Op([self.comm.Iallreduce(MPI.IN_PLACE, mpitypes.buffer(t), op)], self._divide(name, t))

    def allreduce(self, tensors, opts=_DEFAULT):
        t = _single(tensors, "allreduce")
        return self._submit("allreduce", [self._allreduce(t, opts.reduceOp, "allreduce")], tensors, opts)

    def allreduce_coalesced(self, tensors, opts=_DEFAULT):
        for t in tensors:  # every check before the first request starts
            self._op(opts.reduceOp, _check(t, "all_reduce_coalesced").dtype, "all_reduce_coalesced")
        # One request per tensor, all in flight at once: no flattening copy.
        ops = [self._allreduce(t, opts.reduceOp, "all_reduce_coalesced") for t in tensors]  # all checked above
        return self._submit("all_reduce_coalesced", ops, tensors, opts)

    def reduce(self, tensors, opts=_DEFAULT):
        t = _single(tensors, "reduce")
        root = self._root(opts.rootRank, "reduce")
        name, op = self._op(opts.reduceOp, t.dtype, "reduce")
        if self._rank == root:
            started = _Op([self.comm.Ireduce(MPI.IN_PLACE, mpitypes.buffer(t), op, root)], self._divide(name, t))
        else:
            started = _Op([self.comm.Ireduce(mpitypes.buffer(t), None, op, root)])
        return self._submit("reduce", [started], tensors, opts)

    def _reduce_scatter_tensor(self, output, input, reduce_op, call: str) -> _Op:
        _check(output, call), _check(input, call)
        if input.numel() != output.numel() * self._size or input.dtype != output.dtype:
            raise ValueError(
                f"mpi4py backend: {call}: input must be {self._size} x output ({output.numel()} "
                f"elements of {output.dtype}), got {input.numel()} of {input.dtype}"
            )
        name, op = self._op(reduce_op, output.dtype, call)
        req = self.comm.Ireduce_scatter_block(mpitypes.buffer(input), mpitypes.buffer(output), op)
        return _Op([req], self._divide(name, output))

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
        out = _single(output_tensors, "reduce_scatter")
        if len(input_tensors) != 1:
            raise _unsupported("reduce_scatter", f"{len(input_tensors)} input lists")
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
        t = _single(tensors, "broadcast")
        req = self.comm.Ibcast(mpitypes.buffer(t), self._root(opts.rootRank, "broadcast"))
        return self._submit("broadcast", [_Op([req])], tensors, opts)

    def _allgather(self, slots, t: torch.Tensor, call: str) -> _Op:
        slots = self._slots(slots, _check(t, call), call)
        return _Op([self.comm.Iallgatherv(mpitypes.as_bytes(t), mpitypes.scattered(slots))])

    def allgather(self, output_tensors, input_tensors, opts=_DEFAULT):
        t = _single(input_tensors, "all_gather")
        if len(output_tensors) != 1:
            raise _unsupported("all_gather", f"{len(output_tensors)} output lists")
        return self._submit("all_gather", [self._allgather(output_tensors[0], t, "all_gather")], output_tensors, opts)

    def allgather_coalesced(self, output_lists, input_tensors, opts=_DEFAULT):
        call = "all_gather_coalesced"
        pairs = self._pairs(call, output_lists, input_tensors)
        return self._submit(call, [self._allgather(o, i, call) for o, i in pairs], output_lists, opts)

    def _all_gather_tensor(self, output, input, call: str) -> _Op:
        _check(output, call), _check(input, call)
        if output.numel() != input.numel() * self._size or input.dtype != output.dtype:
            raise ValueError(
                f"mpi4py backend: {call}: output must be {self._size} x input ({input.numel()} "
                f"elements of {input.dtype}), got {output.numel()} of {output.dtype}"
            )
        return _Op([self.comm.Iallgather(mpitypes.buffer(input), mpitypes.buffer(output))])

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
        t = _single(input_tensors, "gather")
        root = self._root(opts.rootRank, "gather")
        recv = None
        if self._rank == root:
            if len(output_tensors) != 1:
                raise _unsupported("gather", f"{len(output_tensors)} output lists")
            recv = mpitypes.scattered(self._slots(output_tensors[0], t, "gather"))
        req = self.comm.Igatherv(mpitypes.as_bytes(t), recv, root)
        return self._submit("gather", [_Op([req])], output_tensors, opts)

    def scatter(self, output_tensors, input_tensors, opts=_DEFAULT):
        t = _single(output_tensors, "scatter")
        root = self._root(opts.rootRank, "scatter")
        send = None
        if self._rank == root:
            if len(input_tensors) != 1:
                raise _unsupported("scatter", f"{len(input_tensors)} input lists")
            send = mpitypes.scattered(self._slots(input_tensors[0], t, "scatter"))
        req = self.comm.Iscatterv(send, mpitypes.as_bytes(t), root)
        return self._submit("scatter", [_Op([req])], output_tensors, opts)

    def alltoall(self, output_tensors, input_tensors, opts=_DEFAULT):
        """``dist.all_to_all``: input ``j`` goes to rank ``j``, output ``i`` comes from rank ``i``;
        sizes may differ from one peer to the next (each pair must agree)."""
        for t in list(output_tensors) + list(input_tensors):
            _check(t, "all_to_all")
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(f"mpi4py backend: all_to_all needs {self._size} input and output tensors")
        if len({t.dtype for t in list(output_tensors) + list(input_tensors)}) > 1:
            raise ValueError("mpi4py backend: all_to_all needs one dtype for every tensor")
        req = self.comm.Ialltoallv(mpitypes.scattered(input_tensors), mpitypes.scattered(output_tensors))
        return self._submit("all_to_all", [_Op([req])], output_tensors, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=_DEFAULT):
        """``dist.all_to_all_single``: rows of ``input`` cut by ``input_split_sizes`` (equal if empty)."""
        call = "all_to_all_single"
        _check(output, call), _check(input, call)
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
        t = _single(tensors, "send")
        req = self.comm.Isend(mpitypes.buffer(t), dstRank, self._tag(tag, "send"))
        return self._submit("send", [_Op([req])], tensors)

    def recv(self, tensors, srcRank: int, tag: int):
        t = _single(tensors, "recv")
        req = self.comm.Irecv(mpitypes.buffer(t), srcRank, self._tag(tag, "recv"))
        return self._submit("recv", [_Op([req])], tensors)

    def recv_anysource(self, tensors, tag: int):
        t = _single(tensors, "recv")
        req = self.comm.Irecv(mpitypes.buffer(t), MPI.ANY_SOURCE, self._tag(tag, "recv"))
        return self._submit("recv", [_Op([req])], tensors, statuses=True)  # the status names the sender

    def barrier(self, opts=_DEFAULT):
        return self._submit("barrier", [_Op([self.comm.Ibarrier()])], [], opts)


def _create(opts, _backend_options=None) -> MPI4PyProcessGroup:
    """``dist.Backend`` creator: the group over MPI_COMM_WORLD or over the ranks torch asks for."""
    world = MPI.COMM_WORLD
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    if dist.is_initialized() and dist.get_rank() != world.rank or len(ranks) > world.size:
        raise RuntimeError(
            f"mpi4py backend: torch's rank {dist.get_rank() if dist.is_initialized() else '?'} is not MPI's "
            f"{world.rank} (of {world.size}); start the job with mpiexec and init_process_group('mpi4py')"
        )
    if not opts.global_ranks_in_group and (opts.group_rank, opts.group_size) != (world.rank, world.size):
        raise RuntimeError(
            f"mpi4py backend: torch asked for rank {opts.group_rank} of {opts.group_size}, but MPI runs this "
            f"process as rank {world.rank} of {world.size}; launch with mpiexec -n {opts.group_size}"
        )
    if ranks == list(range(world.size)):
        comm = world.Dup()  # its own context: the group's messages never match the user's
    else:
        group = world.Get_group().Incl(ranks)
        comm = world.Create_group(group)  # collective over the members only, as torch calls it
        group.Free()
    if comm.Get_rank() != opts.group_rank:
        raise RuntimeError(f"mpi4py backend: group rank {comm.Get_rank()} but torch expects {opts.group_rank}")
    return MPI4PyProcessGroup(comm, opts.timeout)


def register() -> None:
    """Register the ``"mpi4py"`` backend with torch.distributed (done on import; idempotent)."""
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
    rendezvous.install()


register()
