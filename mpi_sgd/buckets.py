"""Gradient buckets: which parameters share one all-reduce, and the buffer their gradients land in.

:func:`make_buckets` groups parameters, in the order given, into buckets of about ``bucket_bytes``
(a dtype change starts a new one, since one buffer holds one dtype); the flat strategy asks for a
single bucket, the bucketed one for buckets of ``--bucket-mb`` in reverse parameter order (see
:mod:`mpi_sgd.gradsync`). In a bucket of several tensors every ``param.grad`` is a view into the
bucket's flat buffer, so backward accumulates straight into what is all-reduced, with no copies.

Where the buckets live. When the communicator can share memory between the ranks of a node
(``comm.node_shared``: the mpi4py backend with two or more ranks on a host), the buffers are
allocated through ``comm.alloc_shared`` (:func:`shared_alloc`), so the all-reduce reads and
writes the other ranks' buckets directly (:mod:`mpi_sgd.comm.shm.allreduce`) instead of copying
through MPI. Then every parameter's gradient is a view into a shared bucket, large ones included;
``shared=False`` keeps ordinary buffers.
"""

from __future__ import annotations

import torch
from torch import nn

from .comm.buffers import zeros as comm_zeros


class Bucket:
    """Parameters whose gradients are all-reduced together, in ``buffer``.

    A *solo* bucket holds a single tensor (one too large to share a bucket, usually). In ordinary
    memory it needs no buffer of its own: its buffer is the gradient tensor autograd produced,
    reduced in place. A view into a bucket would cost a zeroing pass and an accumulating add per
    step instead of autograd simply handing its fresh tensor over.

    A *shared* bucket (node-shared memory, ``shared``) holds every tensor, solo or not, since
    its all-reduce is much cheaper than MPI's. There autograd still hands its fresh gradient over,
    and :meth:`land` copies it into the bucket from the parameter's hook while it is in cache: one
    copy instead of a zeroing pass, a read of the fresh gradient and a read-modify-write of the
    bucket.

    Whoever sets ``.grad`` to None behind the strategy's back (``optimizer.zero_grad()``, whose
    default does) makes autograd hand over a fresh tensor where the bucket expected to accumulate
    in place: :meth:`ensure_buffer` lands such gradients (and re-reads a solo bucket's tensor)
    before each all-reduce, so what is reduced is always this step's gradient, never last step's.
    """

    __slots__ = ("buffer", "params", "solo", "name", "request", "started", "finished", "views", "shared")

    def __init__(self, buffer, params: list[nn.Parameter], name: str, views=None, shared: bool = False):
        self.buffer, self.params, self.solo, self.name = buffer, params, buffer is None, name
        self.request, self.started, self.finished = None, 0.0, None
        self.views = views  # buckets of a buffer: {id(param): its slot in buffer}
        self.shared = shared  # in node-shared memory: gradients land from the hooks

    def zero_grad(self) -> None:
        if self.shared:
            for p in self.params:
                p.grad = None
        elif self.solo:
            self.params[0].grad = self.buffer = None
        else:  # each .grad back in its slot (set to None, or replaced, since), then one zeroing pass
            for p in self.params:
                view = self.views[id(p)]
                if p.grad is not view:
                    p.grad = view
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
        """The buffer to all-reduce now, holding this step's gradients: those not in their slot
        (unused this step, or a fresh tensor after ``.grad`` was set to None) land first."""
        if self.views is not None:
            for p in self.params:
                self.land(p)
        else:  # solo: the parameter's own gradient tensor, whichever it is this step
            p = self.params[0]
            if p.grad is None:  # unused this step
                p.grad = torch.zeros_like(p)
            self.buffer = p.grad
        return self.buffer


def shared_alloc(comm, params: list[nn.Parameter], shared: bool | None):
    """``comm.alloc_shared`` if the buckets should live in node-shared memory, else None.

    The answer must be the same on every rank (bucket layouts must match): ``comm.node_shared`` is,
    and so are the model's devices and dtypes.
    """
    if shared is False or (shared is None and not comm.node_shared):
        return None
    if all(p.device.type == "cpu" and p.dtype in (torch.float32, torch.float64) for p in params):
        return comm.alloc_shared
    return None


def make_buckets(params: list[nn.Parameter], bucket_bytes: float, alloc=None) -> list[Bucket]:
    """Group ``params`` (in the given order) into buckets of about ``bucket_bytes`` each. In a shared
    bucket every ``param.grad`` becomes a view into the bucket's buffer; without ``alloc`` (node-shared
    memory, see :func:`shared_alloc`) a tensor alone in its bucket is a solo bucket (see
    :class:`Bucket`). A dtype change starts a new bucket, since one buffer holds one dtype."""
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
        # alone and laid out as MPI takes it (a channels_last tensor gets a contiguous slot instead)
        if len(group) == 1 and alloc is None and group[0].is_contiguous():
            buckets.append(Bucket(None, group, f"allreduce[{len(buckets)}]"))
            continue
        numel = sum(p.numel() for p in group)
        buffer = alloc(numel, group[0].dtype) if alloc else comm_zeros(numel, group[0].dtype, group[0].device)
        offset, views = 0, {}
        for p in group:
            # laid out as p is (channels_last, say), so that autograd accumulates into it as it is
            layout = torch.empty_like(p, device="meta").stride()
            view = views[id(p)] = buffer[offset : offset + p.numel()].as_strided(p.shape, layout)
            if p.grad is not None:
                view.copy_(p.grad)
            # Autograd accumulates into an existing .grad in place, so gradients land in the
            # bucket directly while .grad stays the view (zero_grad() zeroes the buffer instead);
            # a .grad set to None is landed before the all-reduce (ensure_buffer). Shared buckets
            # set it to None on purpose and land each gradient from its hook.
            p.grad = view
            offset += p.numel()
        buckets.append(Bucket(buffer, group, f"allreduce[{len(buckets)}]", views, shared=alloc is not None))
    return buckets
