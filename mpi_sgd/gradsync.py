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

Flat and bucketed gradients live in buckets (:mod:`mpi_sgd.buckets`), in node-shared memory when
the communicator offers it (``shared=False`` keeps ordinary buffers); the bucketed strategy starts
them in one order on every rank (:mod:`mpi_sgd.bucketorder`).

Use: ``sync.zero_grad()``; for each micro-batch ``with sync.accumulate(last=...):
(loss * sync.loss_scale).backward()``, ``last=True`` on the final one only (see
:meth:`GradSync.accumulate`); then ``sync.wait()`` before ``optimizer.step()``. ``seconds``
accumulates the time spent blocked in communication (the T_sync of the speedup model).

Where the 1/R goes. The naive strategy sums and then divides every gradient element by R, as the
formula reads. The flat and bucketed ones fold 1/R into the loss instead (``loss_scale``): one
scalar multiply before backward replaces a pass over all gradients after the sum, a pass that
costs as much as reading and writing every gradient once. Backward is linear in the loss, so the
result differs from dividing afterwards only by rounding (not at all when R is a power of two).

The non-finite flag that rides in their all-reduces is :mod:`mpi_sgd.nonfinite`.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from .bucketorder import BucketOrder
from .buckets import make_buckets, shared_alloc
from .nonfinite import NonFiniteFlag
from .replicas import broadcast_parameters as broadcast_parameters  # scripts call it beside make()

STRATEGIES = ("naive", "flat", "bucketed")


class GradSync(NonFiniteFlag):
    """What the trainer calls; subclasses fill in how the averaging is done."""

    def __init__(self, model: nn.Module, comm=None, events: list | None = None):
        self.model, self.comm = model, comm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.seconds = 0.0  # time blocked in communication since the last reset
        self.loss_scale = 1.0  # multiply the loss by this before backward
        self.events = events  # (name, start, duration) tuples when a timeline is wanted
        self._sending = False  # inside accumulate(last=True): backward may start communicating
        self.noise = None  # a mpi_sgd.noisescale.NoiseProbe, to measure the gradient noise scale
        self.reset_nonfinite()

    def outgoing(self, buf: torch.Tensor, shards: int = 1, result: torch.Tensor | None = None) -> torch.Tensor:
        """Every buffer a strategy sends, just before the collective: measured for the noise scale
        (if on), then checked for non-finite values (:meth:`NonFiniteFlag.outgoing`)."""
        total = self.noise.sent(buf, self.loss_scale) if self.noise is not None else None
        return super().outgoing(buf, shards, result, total)

    def averaged_part_sq(self) -> torch.Tensor:
        """After :meth:`wait`: this rank's part of the averaged gradient's squared norm, the parts of
        all ranks summing to the whole (every R-th parameter here, as every rank holds them all)."""
        from .noisescale import sliced_sq_norm

        size, rank = (self.comm.size, self.comm.rank) if self.comm is not None else (1, 0)
        return sliced_sq_norm([p.grad for p in self.params], rank, size)

    def zero_grad(self) -> None:
        # None rather than zeros: autograd then hands its fresh gradient over without a copy.
        for p in self.params:
            p.grad = None

    @contextlib.contextmanager
    def accumulate(self, last: bool = False):
        """Wrap one micro-batch's backward; say ``last=True`` on the final micro-batch of a step.

        Inside ``accumulate(last=True)`` backward starts the all-reduces as gradients become
        ready, overlapping the rest of backward. Everywhere else (the other blocks, and a backward
        outside any block) gradients only accumulate on this rank, and :meth:`wait` sends what is
        left. So every spelling averages all micro-batches of all ranks; naming the last buys the
        overlap.

        Why ``last`` defaults to False: the safe spelling is the default one. With True as the
        default, the natural ``with sync.accumulate():`` around every micro-batch sent every one,
        and since the bucketed sums carry the 1/R in the loss (:attr:`loss_scale`), a second send
        adds an earlier micro-batch's average R times over: a wrong step, and nothing to say so.
        DDP's shape (``no_sync()`` around every micro-batch but the last) and a ``last`` with no
        default would both turn that spelling, which scripts already use, into an error; this
        default makes it right instead, at the price of the overlap, which one keyword buys back.
        The mistake left, ``last=True`` on a micro-batch that is not the last, cannot pass
        silently: the next backward finds its bucket sent already and raises
        :class:`~mpi_sgd.bucketorder.SentTwice`.
        """
        self._sending = last
        try:
            yield
        finally:
            self._sending = False

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
            elif not p.grad.is_contiguous():  # channels_last, say: MPI takes contiguous memory
                p.grad = p.grad.contiguous()
            self.comm.allreduce(self.outgoing(p.grad), "avg")
        t1 = time.perf_counter()
        self.seconds += t1 - t0
        self.record("allreduce", t0, t1)


class FlatAllReduce(GradSync):
    """All gradients in one flat buffer; one all-reduce after backward."""

    def __init__(self, model, comm, events=None, shared: bool | None = None):
        super().__init__(model, comm, events)
        self.buckets = make_buckets(self.params, float("inf"), shared_alloc(comm, self.params, shared))
        self.loss_scale = 1.0 / comm.size  # the ranks' sum is then the average
        for b in self.buckets:
            if b.shared:
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

    Order: buckets start in index order on every rank, a ready one waiting for its predecessors
    (:class:`~mpi_sgd.bucketorder.BucketOrder`).

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
        alloc = shared_alloc(comm, self.params, shared)
        self.buckets = make_buckets(self.params[::-1], bucket_mb * 2**20, alloc)
        self.loss_scale = 1.0 / comm.size
        self.order = BucketOrder([len(b.params) for b in self.buckets], self._start)
        index = {id(p): i for i, b in enumerate(self.buckets) for p in b.params}
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._make_hook(index[id(p)]))

    def _make_hook(self, i: int):
        bucket = self.buckets[i]

        def hook(param):
            if bucket.shared:
                bucket.land(param)
            if not self._sending:
                return  # not the final micro-batch: keep accumulating locally
            t0 = time.perf_counter()
            self.order.arrive(i)
            for j in self.order.started:
                b = self.buckets[j]
                if b.finished is None and b.request.test():
                    b.finished = time.perf_counter()
            self.order.start_ready()
            self.seconds += time.perf_counter() - t0

        return hook

    def _start(self, i: int) -> None:
        b = self.buckets[i]
        b.started = time.perf_counter()
        b.request = self.comm.iallreduce(self.outgoing(b.ensure_buffer()), "sum")

    def wait(self) -> None:
        t0 = time.perf_counter()
        # Parameters that got no gradient this step never fire their hook; their (zero) slots are
        # reduced along with the rest so every rank still starts the same collectives.
        self.order.flush()
        for b in (self.buckets[j] for j in self.order.started):
            if b.finished is None:
                b.request.wait()
                b.finished = time.perf_counter()
            # from start to the moment this rank saw it complete (a later poll or this wait)
            self.record(b.name, b.started, b.finished)
        self.seconds += time.perf_counter() - t0
        self.order.reset()
        for b in self.buckets:
            b.finished = None


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
