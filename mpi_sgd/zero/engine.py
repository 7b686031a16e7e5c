"""When each collective of ZeRO runs: the hooks that shard gradients and parameters around a step.

:class:`ZeroEngine` is a gradient strategy (:class:`~mpi_sgd.gradsync.GradSync`), so the trainer
drives it as it drives the all-reduce strategies: ``zero_grad()``, one ``accumulate(last=...)`` block
per micro-batch around backward, ``wait()``, then the optimizer step (:mod:`.optim`).

* **Stage 1.** Gradients accumulate locally in full, as in plain data parallel. When the last
  micro-batch's backward has produced a unit's gradients, the unit's reduce-scatter starts (from
  the parameter's post-accumulate hook): each rank receives the sum over ranks of *its shard*,
  the only part its optimizer reads.
* **Stage 2.** Each unit's flat gradient is allocated just before backward reaches the unit (a
  hook on the module's output), reduce-scattered as soon as it is complete, and freed as soon as
  that finishes, so full gradients exist one unit or two at a time. With gradient accumulation
  every micro-batch is reduce-scattered and summed into the shard: memory stays at 1/R, at the
  price of one reduce-scatter per micro-batch instead of one per step.
* **Stage 3.** Parameters are gathered just in time: before a unit's forward and again before
  its backward, and freed after each. While one unit computes, the next one's all-gather is in
  flight (the next in forward order during forward, the previous during backward).

Overlap and progress, as in :class:`~mpi_sgd.gradsync.BucketedAllReduce`: MPICH moves a
non-blocking collective on only while the process is inside an MPI call, so every hook polls the
collectives in flight. Collectives start in a fixed order on every rank (reduce-scatters in
reverse module order, the order backward completes the units of a sequential model; a unit that
is ready early waits for its predecessors: :mod:`mpi_sgd.bucketorder`), as MPI requires.

The 1/R of the average is folded into the loss (``loss_scale``), as the flat and bucketed
strategies do, so the reduce-scatters sum.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from ..bucketorder import BucketOrder
from ..gradsync import GradSync
from .units import Unit, build_units

STAGES = (1, 2, 3)


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []


class ZeroEngine(GradSync):
    """ZeRO stage ``stage`` (1, 2 or 3) for ``model`` over ``comm``; see the module docstring."""

    def __init__(self, model: nn.Module, comm, stage: int, events: list | None = None):
        if stage not in STAGES:
            raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage!r}")
        super().__init__(model, comm, events)
        self.stage = stage
        self.loss_scale = 1.0 / comm.size
        self.units: list[Unit] = build_units(model, comm.rank, comm.size, separate_shard=stage == 3)
        # Every rank must cut the same units, or the collectives below would pair up buffers of
        # different sizes (MPI truncates, or reduces garbage). One small collective, once.
        layouts = comm.allgather_obj([(u.name, u.numel, str(u.dtype)) for u in self.units])
        for r, layout in enumerate(layouts):
            if layout != layouts[0]:
                raise ValueError(
                    f"rank {r} built other units than rank 0 (a different model?): {layout} vs {layouts[0]}"
                )
        self.memory = None  # a MemoryTracker (see .memory) sampled at every event, when measuring
        self._index = {id(u): i for i, u in enumerate(self.units)}
        self._order = self.units[::-1]  # the order reduce-scatters start in
        self.order = BucketOrder([len(u.params) for u in self._order], self._start)
        self._fresh: set[int] = set()  # units whose next reduce-scatter overwrites grad_shard
        self._idle = False  # stages 2-3: the last micro-batch's block ended with its collectives done
        self.kept = False  # stage 3 after training: the parameters stay gathered (keep_gathered)
        for i, u in enumerate(self._order):
            for p in u.params:
                p.register_post_accumulate_grad_hook(self._on_grad(u, i))
            if stage >= 2:
                u.module.register_forward_hook(self._after_forward(u))
            if stage == 3:
                u.module.register_forward_pre_hook(self._before_forward(u))
                u.free_params()
            if stage == 1:
                u.alloc_grad()  # kept for the whole run, as plain data parallel keeps its gradients
        self.zero_grad()

    # -- what the trainer calls -------------------------------------------------------------
    def keep_gathered(self) -> None:
        """Stage 3, once training is over: gather every parameter and keep it, so that the model is
        an ordinary module again (``state_dict()``, ``parameters()``, forward) at the memory of a
        full replica; freed parameters have storage of size 0, and reading them would read freed
        memory. A collective. The next training step frees them again as it goes."""
        if self.stage == 3:
            for u in self.units:
                self._gather(u)
            self.kept = True

    def zero_grad(self) -> None:
        self.kept = False
        if self.stage == 1:
            for u in self.units:
                u.grad.zero_()
        self._fresh = {id(u) for u in self.units}
        self._idle = False

    @contextlib.contextmanager
    def accumulate(self, last: bool = False):
        """As :meth:`GradSync.accumulate`. Stages 2-3 reduce-scatter every micro-batch whatever
        ``last`` says, summing into the shard (memory stays at 1/R), and complete them as the block
        ends, unless it is the ``last``, whose collectives :meth:`wait` completes. So there each
        micro-batch needs a block of its own: a second backward with none between would send its
        units again, which raises :class:`~mpi_sgd.bucketorder.SentTwice`."""
        self._idle = False
        with super().accumulate(last):
            yield
        if not last and self.stage >= 2:
            self._finish()
            self._idle = True  # wait() has nothing left to send unless another backward comes

    def wait(self) -> None:
        """Every unit's ``grad_shard`` holds this rank's shard of the gradient averaged over ranks."""
        if not self._idle:
            self._finish()

    def averaged_part_sq(self) -> torch.Tensor:
        """After :meth:`wait`: the squared norm of this rank's shards, which sum over ranks to the whole."""
        return sum(u.grad_shard.view(-1).dot(u.grad_shard.view(-1)).double() for u in self.units)

    @contextlib.contextmanager
    def full_parameters(self):
        """Every parameter of the model present inside the block (stage 3 gathers, then frees). A collective."""
        if self.stage == 3:
            for u in self.units:
                self._gather(u)
        try:
            yield self.model
        finally:
            if self.stage == 3:
                for u in self.units:
                    self._free(u)

    def gather_updated(self) -> None:
        """Stages 1-2, after the optimizer step: every rank gets every rank's updated shard."""
        t0 = time.perf_counter()
        # A copy to send from: MPI may not read and write one buffer in one call, and a rank's
        # shard is a slice of the very buffer the all-gather fills.
        requests = [(self.comm.iallgather(u.shard.clone(), u.slots()), u) for u in self.units]
        for request, u in requests:
            request.wait()
            self.record(f"allgather {u.name}", t0, time.perf_counter())
        self.seconds += time.perf_counter() - t0
        self._sample()

    # -- hooks ------------------------------------------------------------------------------
    def _before_forward(self, u: Unit):
        def hook(module, args):
            t0 = time.perf_counter()
            self._poll()
            self._gather(u)
            i = self._index[id(u)]
            if i + 1 < len(self.units):
                self._start_gather(self.units[i + 1])  # prefetch: gathers while this unit computes
            self._sample()
            self.seconds += time.perf_counter() - t0

        return hook

    def _after_forward(self, u: Unit):
        def hook(module, args, output):
            if self.stage == 3:
                self._free(u)
                self._sample()
            for t in _tensors(output):
                if t.requires_grad:  # fires when backward reaches this unit, before it runs
                    t.register_hook(self._before_backward(u))

        return hook

    def _before_backward(self, u: Unit):
        def hook(grad):
            self._idle = False
            t0 = time.perf_counter()
            self._poll()
            u.alloc_grad()
            if self.stage == 3:
                self._gather(u)
                i = self._index[id(u)]
                if i > 0:
                    self._start_gather(self.units[i - 1])  # the next unit backward reaches
            self._sample()
            self.seconds += time.perf_counter() - t0

        return hook

    def _on_grad(self, u: Unit, i: int):
        def hook(p):
            self._idle = False
            if self.stage == 1 and not self._sending:
                return  # not the final micro-batch: keep accumulating locally
            t0 = time.perf_counter()
            if self.stage >= 2:
                u.adopt_grad(p)
            if self.order.arrive(i) and self.stage == 3:
                self._free(u)  # every node that saved these parameters has run
            self._poll()
            self.order.start_ready()
            self._sample()
            self.seconds += time.perf_counter() - t0

        return hook

    # -- collectives ------------------------------------------------------------------------
    def _start(self, i: int) -> None:
        u = self._order[i]
        if self.stage >= 2:
            # One reduce-scatter in flight at a time: it overlaps the backward of the next unit,
            # and at most two units' full gradients exist at once (the one being reduced, the
            # one being produced). MPICH moves a large non-blocking collective on only a little
            # per poll, so without this bound every unit's gradient could still be waiting.
            self._complete_started()
        u.alloc_grad()  # no-op unless the unit got no gradient: then zeros, so ranks still match
        recv = u.grad_shard if id(u) in self._fresh else torch.empty_like(u.grad_shard)
        self._fresh.discard(id(u))
        # (the non-finite flag rides in element 0 of every shard: see GradSync.outgoing)
        self.outgoing(u.grad, self.comm.size, u.grad_shard)
        u.reduce = (self.comm.ireduce_scatter(u.grad, recv), recv, time.perf_counter())

    def _complete_started(self) -> None:
        """Wait for the reduce-scatters started so far, in start order, so the micro-batches' shards
        are summed in the same order on every run; free full gradients (stages 2-3)."""
        for u in (self._order[i] for i in self.order.started):
            if u.reduce is None:
                continue
            request, recv, started = u.reduce
            request.wait()
            if recv is not u.grad_shard:
                u.grad_shard += recv
            u.reduce = None
            self.record(f"reduce_scatter {u.name}", started, time.perf_counter())
            if self.stage >= 2:
                u.free_grad()

    def _start_gather(self, u: Unit) -> None:
        if u.gather is None and not u.gathered:
            u.alloc_params()
            u.gather = (self.comm.iallgather(u.shard, u.slots()), time.perf_counter())

    def _gather(self, u: Unit) -> None:
        self._start_gather(u)
        if u.gather is not None:
            request, t0 = u.gather
            request.wait()
            u.gather = None
            self.record(f"allgather {u.name}", t0, time.perf_counter())

    def _free(self, u: Unit) -> None:
        if u.gather is not None:  # prefetched but never used: finish it before releasing its memory
            u.gather[0].wait()
            u.gather = None
        if not self.kept:
            u.free_params()

    def _poll(self) -> None:
        """Drive MPI's progress on the collectives in flight (see the module docstring)."""
        for u in self.units:
            if u.reduce is not None:
                u.reduce[0].test()
            if u.gather is not None:
                u.gather[0].test()

    def _finish(self) -> None:
        t0 = time.perf_counter()
        self.order.flush()
        self._complete_started()
        if self.stage == 3:
            for u in self.units:
                self._free(u)
        self.order.reset()
        self.seconds += time.perf_counter() - t0
        self._sample()

    # -- measurement ------------------------------------------------------------------------
    def _sample(self) -> None:
        if self.memory is not None:
            self.memory.sample()

    def state_tensors(self) -> tuple[list, list]:
        """(parameter, gradient) tensors this engine holds, for :mod:`.memory`."""
        params = [t for u in self.units for t in (u.full, u.shard)]
        grads = [t for u in self.units for t in (u.grad, u.grad_shard, u.reduce and u.reduce[1])]
        return params, grads
