"""Gradient averaging for synchronous SGD, in three steps of sophistication.

Synchronous SGD on R ranks, each with a batch of B samples, takes the step one process would
take with batch R*B: the mean loss over R*B samples is the mean of the R per-rank means, and
the gradient is linear, so ([S-SGD], eq. 4)

    g = (1/R) * sum_r grad L_r(theta)        (L_r: mean loss over rank r's B samples)

Each strategy below leaves exactly that ``g`` in every ``param.grad``:

1. :class:`NaiveAllReduce`: after backward, one all-reduce per parameter tensor (seeds 000/003).
   Simple; pays the collective's latency once per tensor.
2. :class:`FlatAllReduce`: gradients live in one flat buffer (each ``param.grad`` is a view of
   its slice), so after backward a single all-reduce covers them all, with no copies.
3. :class:`BucketedAllReduce`: gradients are grouped into buckets of about ``bucket_mb`` MB in
   reverse parameter order (the order backward produces them), and each bucket's non-blocking
   all-reduce starts from an autograd hook the moment its last gradient is accumulated, so
   communication overlaps the rest of backward (the scheme of PyTorch DDP, Li et al., VLDB
   2020). Small tensors share a flat bucket buffer (their ``.grad`` are views of it); a tensor
   alone in its bucket is reduced where autograd put its gradient.

Where the buckets live. When the communicator can share memory between the ranks of a node
(``comm.node_shared``: the mpi4py backend with two or more ranks on a host), flat and bucketed
gradients are allocated through ``comm.alloc_shared``, so the all-reduce reads and writes the other
ranks' buckets directly (:mod:`mpi_sgd.comm.shm.allreduce`) instead of copying through MPI. Then
every parameter's gradient is a view into a shared bucket, large ones included; ``shared=False``
keeps today's ordinary buffers.

Use: ``sync.zero_grad()``; for each micro-batch ``with sync.accumulate(last=...):
(loss * sync.loss_scale).backward()``; then ``sync.wait()`` before ``optimizer.step()``.
``seconds`` accumulates the time spent blocked in communication (the T_sync of the speedup model).

Where the 1/R goes. The naive strategy sums and then divides every gradient element by R, as the
formula reads. The flat and bucketed ones fold 1/R into the loss instead (``loss_scale``): one
scalar multiply before backward replaces a pass over all gradients after the sum, a pass that
costs as much as reading and writing every gradient once. Backward is linear in the loss, so the
result differs from dividing afterwards only by rounding (not at all when R is a power of two).

A little over 300 lines: the three strategies share one base (buckets, hooks) and differ by a few
dozen lines each; split apart they would import each other's internals. The non-finite flag that
rides in their all-reduces is :mod:`mpi_sgd.nonfinite`.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from .comm.buffers import zeros as comm_zeros
from .nonfinite import NonFiniteFlag

STRATEGIES = ("naive", "flat", "bucketed")


def broadcast_parameters(model: nn.Module, comm, root: int = 0) -> None:
    """Give every rank the root's parameters and buffers, so all replicas start identical.

    Same-seed initialisation would do it too, until someone initialises with ``seed + rank`` or
    a library draws from the RNG in a rank-dependent way; one broadcast costs little and makes it
    certain ([S-SGD]'s ``sync_initial_weights``, as a collective instead of R-1 sends).
    """
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            comm.broadcast(t.data, root)


class GradSync(NonFiniteFlag):
    """What the trainer calls; subclasses fill in how the averaging is done."""

    def __init__(self, model: nn.Module, comm=None, events: list | None = None):
        self.model, self.comm = model, comm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.seconds = 0.0  # time blocked in communication since the last reset
        self.loss_scale = 1.0  # multiply the loss by this before backward
        self.events = events  # (name, start, duration) tuples when a timeline is wanted
        self._last = True
        self.reset_nonfinite()

    def zero_grad(self) -> None:
        # None rather than zeros: autograd then hands its fresh gradient over without a copy.
        for p in self.params:
            p.grad = None

    @contextlib.contextmanager
    def accumulate(self, last: bool = True):
        """Wrap one micro-batch's backward. Only the ``last`` one of a step communicates."""
        self._last = last
        yield

    def wait(self) -> None:
        """Return once every ``param.grad`` holds the average over all ranks."""
        raise NotImplementedError

    def where(self, phase: str) -> None:
        """Tell the communicator's wrappers (the watchdog) what this rank is doing."""
        if self.comm is not None:
            self.comm.where(phase)

    def record(self, name: str, start: float, end: float) -> None:
        """Add an event to the timeline, if one is kept (the trainer's steps add theirs too)."""
        if self.events is not None:
            self.events.append((name, start, end - start))


class LocalGradients(GradSync):
    """No averaging: every process keeps its own gradients.

    Not a strategy for R > 1 ranks (their replicas would drift apart), so not in
    :data:`STRATEGIES`. It is what one process trains with (``bench grid``, timing T_comp in
    calibration), the no-communication floor ``bench sgd`` compares with, and the right choice
    under torch's DistributedDataParallel, which averages inside backward by itself.
    """

    def wait(self) -> None:
        pass


class NaiveAllReduce(GradSync):
    """One blocking all-reduce per parameter tensor, after backward."""

    def wait(self) -> None:
        t0 = time.perf_counter()
        for p in self.params:
            if p.grad is None:  # unused this step; every rank must still make the same calls
                p.grad = torch.zeros_like(p)
            self.comm.allreduce(self.outgoing(p.grad), "avg")
        t1 = time.perf_counter()
        self.seconds += t1 - t0
        self.record("allreduce", t0, t1)


class _Bucket:
    """Parameters whose gradients are all-reduced together, in ``buffer``.

    A *solo* bucket holds a single tensor (one too large to share a bucket, usually). In ordinary
    memory it needs no buffer of its own: its buffer is the gradient tensor autograd produced,
    reduced in place. A view into a bucket would cost a zeroing pass and an accumulating add per
    step instead of autograd simply handing its fresh tensor over.

    A *shared* bucket (node-shared memory, ``views`` set) holds every tensor, solo or not, since
    its all-reduce is much cheaper than MPI's. There autograd still hands its fresh gradient over,
    and :meth:`land` copies it into the bucket from the parameter's hook while it is in cache: one
    copy instead of a zeroing pass, a read of the fresh gradient and a read-modify-write of the
    bucket.
    """

    __slots__ = ("buffer", "params", "solo", "name", "pending", "request", "started", "finished", "views")

    def __init__(self, buffer: torch.Tensor | None, params: list[nn.Parameter], name: str, views=None):
        self.buffer, self.params, self.solo, self.name = buffer, params, buffer is None, name
        self.pending, self.request, self.started, self.finished = len(params), None, 0.0, None
        self.views = views  # shared buckets: {id(param): its slot in buffer}

    def zero_grad(self) -> None:
        if self.views is not None:
            for p in self.params:
                p.grad = None
        elif self.solo:
            self.params[0].grad = self.buffer = None
        else:
            self.buffer.zero_()

    def land(self, p: nn.Parameter) -> None:
        """Shared buckets: move ``p``'s gradient into its slot (zeros if it got none) and point ``.grad`` there."""
        view = self.views[id(p)]
        if p.grad is not view:
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)
            p.grad = view  # later micro-batches accumulate into the slot in place

    def ensure_buffer(self) -> torch.Tensor:
        if self.views is not None:  # gradients whose hook did not run (unused this step) land now
            for p in self.params:
                self.land(p)
        elif self.buffer is None:  # a solo parameter with no gradient yet (unused this step)
            p = self.params[0]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.buffer = p.grad
        return self.buffer


def _shared_alloc(comm, params: list[nn.Parameter], shared: bool | None):
    """``comm.alloc_shared`` if the buckets should live in node-shared memory, else None.

    The answer must be the same on every rank (bucket layouts must match): ``comm.node_shared`` is,
    and so are the model's devices and dtypes.
    """
    if shared is False or (shared is None and not comm.node_shared):
        return None
    if all(p.device.type == "cpu" and p.dtype in (torch.float32, torch.float64) for p in params):
        return comm.alloc_shared
    return None


def _make_buckets(params: list[nn.Parameter], bucket_bytes: float, alloc=None) -> list[_Bucket]:
    """Group ``params`` (in the given order) into buckets of about ``bucket_bytes`` each. In a shared
    bucket every ``param.grad`` becomes a view into the bucket's buffer; without ``alloc`` (node-shared
    memory, see :func:`_shared_alloc`) a tensor alone in its bucket is a solo bucket (see
    :class:`_Bucket`). A dtype change starts a new bucket, since one buffer holds one dtype."""
    groups: list[list[nn.Parameter]] = []
    size = 0.0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if not groups or size + nbytes > bucket_bytes and size > 0 or p.dtype != groups[-1][0].dtype:
            groups.append([])
            size = 0.0
        groups[-1].append(p)
        size += nbytes
    buckets = []
    for group in groups:
        if len(group) == 1 and alloc is None:
            buckets.append(_Bucket(None, group, f"allreduce[{len(buckets)}]"))
            continue
        numel = sum(p.numel() for p in group)
        buffer = alloc(numel, group[0].dtype) if alloc else comm_zeros(numel, group[0].dtype, group[0].device)
        offset, views = 0, {}
        for p in group:
            view = views[id(p)] = buffer[offset : offset + p.numel()].view_as(p)
            if p.grad is not None:
                view.copy_(p.grad)
            # Autograd accumulates into an existing .grad in place, so gradients land in the
            # bucket directly. This holds only while nobody sets .grad to None: the trainer zeroes
            # through zero_grad() below, never optimizer.zero_grad() (which frees the views).
            # Shared buckets set it to None on purpose and land each gradient from its hook.
            p.grad = view
            offset += p.numel()
        buckets.append(_Bucket(buffer, group, f"allreduce[{len(buckets)}]", views if alloc else None))
    return buckets


class FlatAllReduce(GradSync):
    """All gradients in one flat buffer; one all-reduce after backward."""

    def __init__(self, model, comm, events=None, shared: bool | None = None):
        super().__init__(model, comm, events)
        self.buckets = _make_buckets(self.params, float("inf"), _shared_alloc(comm, self.params, shared))
        self.loss_scale = 1.0 / comm.size  # the ranks' sum is then the average
        for b in self.buckets:
            if b.views is not None:
                for p in b.params:
                    p.register_post_accumulate_grad_hook(b.land)

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.zero_grad()

    def wait(self) -> None:
        t0 = time.perf_counter()
        for b in self.buckets:  # one unless the model mixes dtypes
            self.comm.allreduce(self.outgoing(b.ensure_buffer()), "sum")
        t1 = time.perf_counter()
        self.seconds += t1 - t0
        self.record("allreduce", t0, t1)


class BucketedAllReduce(FlatAllReduce):
    """Buckets in reverse parameter order, each all-reduced from an autograd hook as soon as ready.

    Order. MPI requires every rank to start its collectives in the same order, and a model may
    produce gradients in a different order than its parameters are listed; so a bucket that is
    ready before its predecessors waits for them, and buckets always start in index order.

    Progress. MPICH (and Open MPI without a progress thread) advances a non-blocking collective
    only while the process is inside an MPI call; between calls, a started all-reduce sits still.
    Each hook therefore ``test()``\\ s the buckets already in flight: a few microseconds that move
    them on while backward continues. The alternative, ``MPIR_CVAR_ASYNC_PROGRESS=1`` (an MPICH
    progress thread), makes the overlap real between hooks too but burns a core per rank spinning,
    which costs more than it gains when ranks share few cores; it needs ``MPI_THREAD_MULTIPLE``.
    torch.distributed backends (gloo, nccl) progress on their own threads either way. Shared-memory
    buckets progress the same way, by these polls (see :mod:`mpi_sgd.comm.shm.allreduce`).
    """

    def __init__(self, model, comm, bucket_mb: float = 1.0, events=None, shared: bool | None = None):
        GradSync.__init__(self, model, comm, events)
        alloc = _shared_alloc(comm, self.params, shared)
        self.buckets = _make_buckets(self.params[::-1], bucket_mb * 2**20, alloc)
        self.loss_scale = 1.0 / comm.size
        self._next = 0  # the next bucket to start
        self._in_flight: list[_Bucket] = []
        bucket_of = {id(p): b for b in self.buckets for p in b.params}
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._make_hook(bucket_of[id(p)]))

    def _make_hook(self, bucket: _Bucket):
        def hook(param):
            if bucket.views is not None:
                bucket.land(param)
            if not self._last:
                return  # a non-final micro-batch: keep accumulating locally
            t0 = time.perf_counter()
            bucket.pending -= 1
            for b in self._in_flight:
                if b.finished is None and b.request.test():
                    b.finished = time.perf_counter()
            self._start_ready()
            self.seconds += time.perf_counter() - t0

        return hook

    def _start_ready(self, force: bool = False) -> None:
        while self._next < len(self.buckets) and (force or self.buckets[self._next].pending == 0):
            b = self.buckets[self._next]
            b.started = time.perf_counter()
            b.request = self.comm.iallreduce(self.outgoing(b.ensure_buffer()), "sum")
            self._in_flight.append(b)
            self._next += 1

    def wait(self) -> None:
        t0 = time.perf_counter()
        # Parameters that got no gradient this step never fire their hook; their (zero) slots are
        # reduced along with the rest so every rank still starts the same collectives.
        self._start_ready(force=True)
        for b in self._in_flight:
            if b.finished is None:
                b.request.wait()
                b.finished = time.perf_counter()
            # from start to the moment this rank saw it complete (a later poll or this wait)
            self.record(b.name, b.started, b.finished)
        self.seconds += time.perf_counter() - t0
        self._in_flight.clear()
        self._next = 0
        for b in self.buckets:
            b.pending, b.finished = len(b.params), None


def make(
    strategy: str,
    model: nn.Module,
    comm,
    bucket_mb: float = 1.0,
    events: list | None = None,
    compress: str = "none",
    shared: bool | None = None,
) -> GradSync:
    """The strategy named ``strategy`` (one of :data:`STRATEGIES`) for ``model`` on ``comm``.

    ``compress`` ``fp16``/``bf16`` carries its all-reduces in 16 bits (:mod:`mpi_sgd.comm.wrappers.compress`).
    ``shared``: flat and bucketed buckets in node-shared memory when the communicator offers it
    (None, the default), or never (False).
    """
    if compress != "none":
        from .comm.wrappers.compress import DTYPES, CompressedComm

        comm = CompressedComm(comm, DTYPES[compress])
    if strategy == "naive":
        return NaiveAllReduce(model, comm, events)
    if strategy == "flat":
        return FlatAllReduce(model, comm, events, shared)
    if strategy == "bucketed":
        return BucketedAllReduce(model, comm, bucket_mb, events, shared)
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
