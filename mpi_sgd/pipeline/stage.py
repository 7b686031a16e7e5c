"""The stage runtime: one rank runs one stage's ops in schedule order, talking to its neighbours.

Stage ``s`` is rank ``s`` of the communicator it is given. Per micro-batch ``i``:

* ``F(i)``: stage 0 takes rows ``i`` of the batch (``tensor_split``: ``m`` parts whose sizes
  differ by at most one); stage ``s > 0`` receives the activation from ``s-1``. It runs its
  layers and sends the output to ``s+1``; the last stage instead computes the loss, scaled by
  ``len(micro-batch) / len(batch)`` so that the ``m`` scaled losses sum to the mean over the
  whole batch and the accumulated gradients are those of the unsplit model's step.
* ``B(i)``: stage ``s < R-1`` receives the gradient of its output from ``s+1``; backward
  through its layers adds to its parameters' ``.grad``; stage ``s > 0`` sends the gradient of
  its input to ``s-1``. Only the communicator's ``send``/``isend``/``recv`` are used.

**Shapes and dtypes** travel in a header: every tensor is preceded by a small int64 message
``[step, micro-batch, m, kind, dtype, ndim, *shape]``, so a stage allocates what it is about to
receive without knowing the model on the other side, and batches of any size (and uneven
micro-batches) work. The receiver checks step, micro-batch, ``m`` and kind against what its own
schedule expects next, and a returning gradient against the shape and dtype of the activation
it belongs to; a mismatch raises :class:`PipelineError` naming both sides (after taking the
payload off the wire, so the communicator is left clean) instead of training on the wrong data.

**Ordering, not tags, keeps micro-batches apart.** MPI delivers messages from one sender with one
tag and communicator in the order they were sent (non-overtaking), and both ends of every link
walk the micro-batches in the same order: forwards 0..m-1 under both schedules, backwards
m-1..0 under GPipe and 0..m-1 under 1F1B, identical on every stage. So the k-th activation a
stage receives is the k-th its predecessor sent; the header check turns any violation into an
error. Activations use tag ``ACT_TAG`` and gradients ``GRAD_TAG``, which keeps this traffic
apart from other point-to-point users of the same communicator.

**Deadlock freedom.** Sends are non-blocking (``isend``; the buffers stay referenced until the
request completes) and receives block. Then a stage waits only for data, never for a peer to
post a receive, and both schedules are deadlock-free: give each op its slot in the schedule
diagram (:mod:`.schedule`); every op's input comes from an op in an earlier slot on a
neighbour, and each stage runs its ops in slot order, so by induction on the slot every op
runs. With a blocking ``send`` the posting order would matter: MPI may hold a large ``send``
until the receive is posted (rendezvous), and in 1F1B's steady state stage ``s`` sends an
activation forward while stage ``s+1`` sends a gradient back; both would wait in ``send``
forever. It would work with small messages (sent eagerly) and hang with big ones.
``schedule.simulate(..., blocking_sends=True)`` shows that deadlock; GPipe survives it because
each link carries all its activations before any gradient.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
from torch import nn

from ..timing import chrome_trace
from .schedule import schedule as make_schedule

ACT_TAG, GRAD_TAG = 7101, 7102
KINDS = {ACT_TAG: "an activation", GRAD_TAG: "a gradient"}
DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool)
MAX_DIMS = 6
HEADER = 6 + MAX_DIMS  # step, micro-batch, m, kind (tag), dtype code, ndim, shape


class PipelineError(RuntimeError):
    """A stage received something other than what its schedule expects next."""


def encode_header(step: int, mb: int, m: int, tag: int, t: torch.Tensor) -> torch.Tensor:
    if t.dtype not in DTYPES or t.dim() > MAX_DIMS:
        raise PipelineError(
            f"cannot send a {t.dtype} tensor of {t.dim()} dims between stages "
            f"(dtypes {[str(d) for d in DTYPES]}, at most {MAX_DIMS} dims)"
        )
    head = [step, mb, m, tag, DTYPES.index(t.dtype), t.dim(), *t.shape]
    return torch.tensor(head + [0] * (HEADER - len(head)), dtype=torch.int64)


def decode_header(h: torch.Tensor) -> tuple[tuple[int, int, int, int], torch.dtype, tuple[int, ...]]:
    """((step, micro-batch, m, tag), dtype, shape)."""
    v = h.tolist()
    if not (0 <= v[4] < len(DTYPES) and 0 <= v[5] <= MAX_DIMS):
        raise PipelineError(f"malformed pipeline header {v}")
    return tuple(v[:4]), DTYPES[v[4]], tuple(v[6 : 6 + v[5]])


class ActivationMeter:
    """Bytes that autograd keeps for backward on this stage: now, and the peak so far.

    Counted through saved-tensor hooks: every tensor an op saves for its backward is seen when
    saved and released when the graph that holds it is freed (after that micro-batch's
    backward). A tensor saved by several ops (a ReLU's output is also the next layer's input)
    counts once; parameters (the linear layers save their weights) are not activations and are
    left out. A micro-batch that is a slice of the batch counts as its own rows.
    """

    def __init__(self, params):
        self._params = {p.data_ptr() for p in params}
        self._live: dict[tuple[int, int], int] = {}  # (address, bytes) -> references
        self.now = self.peak = 0

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t: torch.Tensor):
        if t.data_ptr() in self._params:
            return t
        key = (t.data_ptr(), t.numel() * t.element_size())
        if key not in self._live:
            self._live[key] = 0
            self.now += key[1]
            self.peak = max(self.peak, self.now)
        self._live[key] += 1
        return _Saved(self, key, t)

    def _release(self, key: tuple[int, int]) -> None:
        self._live[key] -= 1
        if self._live[key] == 0:
            self.now -= key[1]
            del self._live[key]


class _Saved:
    __slots__ = ("meter", "key", "tensor")

    def __init__(self, meter, key, tensor):
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self):
        self.meter._release(self.key)


def _unpack(saved):
    return saved.tensor if isinstance(saved, _Saved) else saved


class PipelineStage:
    """This rank's stage of a pipeline over ``comm`` (stage = rank, ``comm.size`` stages).

    ``loss = stage.forward_backward(x, y)`` runs one step's ``micro_batches`` forwards and
    backwards in the order of ``schedule`` ("gpipe" or "1f1b") and leaves the gradients of the
    whole batch in the stage's ``.grad`` (zeroed first); then each rank steps its own optimizer.
    ``x`` is read on stage 0 and ``y`` on the last stage; other ranks may pass ``None``. The
    mean loss over the batch is returned on the last stage, ``None`` elsewhere; a loss that is not
    finite raises :class:`PipelineError` there before that micro-batch's backward (under ``init``'s abort on
    error, that ends the job). At world size 1
    the one stage is the whole model and no message is sent.

    Per step, ``stats`` gets ``{"span", "busy", "forward", "backward"}``: seconds from entering
    ``forward_backward`` to leaving it (every send completed), and seconds of those spent
    computing (F and B ops; then each kind alone), so ``1 - busy/span`` is this stage's idle
    (bubble) fraction. With ``timeline=True`` each op is
    recorded for :meth:`timeline`; with ``measure_memory=True`` an :class:`ActivationMeter`
    tracks the activation bytes held (``meter.peak``).
    """

    def __init__(
        self,
        comm,
        module: nn.Module,
        loss_fn,
        schedule: str = "1f1b",
        micro_batches: int = 1,
        timeline: bool = False,
        measure_memory: bool = False,
    ):
        self.comm, self.module, self.loss_fn = comm, module, loss_fn
        self.stage, self.stages = comm.rank, comm.size
        self.first, self.last = self.stage == 0, self.stage == self.stages - 1
        self.m = micro_batches
        self.ops = make_schedule(schedule, self.stage, self.stages, micro_batches)
        self.schedule_name = schedule
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.meter = ActivationMeter(self.params) if measure_memory else None
        self.step_count = 0
        self.stats: list[dict] = []
        self.events: list | None = None
        self._pending: list = []  # send requests not yet known to be complete
        self._t0 = time.perf_counter()
        if timeline:
            self.start_timeline()

    # -- messages -----------------------------------------------------------------------------
    def _send(self, t: torch.Tensor, peer: int, tag: int, mb: int) -> None:
        t = t.detach().contiguous()
        head = encode_header(self.step_count, mb, self.m, tag, t)
        self._pending += [self.comm.isend(head, peer, tag), self.comm.isend(t, peer, tag)]

    def _recv(self, peer: int, tag: int, mb: int, like: torch.Tensor | None = None) -> torch.Tensor:
        self._reap()
        head = self.comm.recv(torch.empty(HEADER, dtype=torch.int64), peer, tag)
        meta, dtype, shape = decode_header(head)
        buf = self.comm.recv(torch.empty(shape, dtype=dtype), peer, tag)  # taken off the wire even if wrong
        want = (self.step_count, mb, self.m, tag)
        problem = None
        if meta != want:
            problem = f"step/micro-batch/m {meta[:3]}, expected {want[:3]}"
        elif like is not None and (shape, dtype) != (tuple(like.shape), like.dtype):
            problem = f"shape {shape} {dtype}, expected {tuple(like.shape)} {like.dtype}"
        if problem:
            raise PipelineError(
                f"stage {self.stage} ({self.schedule_name}) got {KINDS[tag]} from rank {peer} with {problem}: "
                "the ranks disagree on the schedule or the micro-batch count"
            )
        return buf

    def _reap(self) -> None:
        self._pending = [r for r in self._pending if not r.test()]

    # -- one step -----------------------------------------------------------------------------
    def forward_backward(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> float | None:
        start = time.perf_counter()
        for p in self.params:
            p.grad = None
        xs = self._split(x, "x") if self.first else None
        ys = self._split(y, "y") if self.last else None
        n = len(y) if self.last else 0
        held: dict[int, tuple] = {}  # micro-batch -> (input, output): what backward needs
        loss, seconds = 0.0, {"F": 0.0, "B": 0.0}
        for op in self.ops:
            i = op.mb
            if op.kind == "F":
                inp = xs[i] if self.first else self._recv(self.stage - 1, ACT_TAG, i).requires_grad_()
                t0 = time.perf_counter()
                with self.meter.hooks() if self.meter else contextlib.nullcontext():
                    out = self.module(inp)
                    if self.last:
                        out = self.loss_fn(out, ys[i]) * (len(ys[i]) / n)
                if self.last:
                    value = out.item()
                    if not math.isfinite(value):  # every later step would train on garbage: stop the job
                        raise PipelineError(
                            f"stage {self.stage}: the loss of micro-batch {i} at step {self.step_count} is {value}"
                        )
                    loss += value
                else:
                    self._send(out, self.stage + 1, ACT_TAG, i)
                held[i] = (inp, out)
            else:
                inp, out = held.pop(i)
                grad = None if self.last else self._recv(self.stage + 1, GRAD_TAG, i, like=out)
                t0 = time.perf_counter()
                if out.requires_grad:  # a first stage without parameters has nothing to do
                    torch.autograd.backward(out, grad)
                if not self.first:
                    self._send(inp.grad, self.stage - 1, GRAD_TAG, i)
                del inp, out
            t1 = time.perf_counter()
            seconds[op.kind] += t1 - t0
            if self.events is not None:
                self.events.append((str(op), t0, t1 - t0, {"micro_batch": i, "stage": self.stage}))
        for r in self._pending:
            r.wait()
        self._pending = []
        self.step_count += 1
        span = time.perf_counter() - start
        self.stats.append(
            {"span": span, "busy": seconds["F"] + seconds["B"], "forward": seconds["F"], "backward": seconds["B"]}
        )
        return loss if self.last else None

    def _split(self, t, name: str):
        if t is None:
            raise ValueError(f"stage {self.stage} needs {name}: stage 0 reads x, the last stage reads y")
        if len(t) < self.m:
            raise ValueError(f"a batch of {len(t)} cannot be cut into {self.m} micro-batches")
        return t.tensor_split(self.m)

    def start_timeline(self) -> None:
        """Record ops from now on, on every rank at once (a collective: lanes start together)."""
        self.comm.barrier()
        self.events, self._t0 = [], time.perf_counter()

    def timeline(self) -> dict | None:
        """The recorded ops of every stage as a Chrome trace (root only): F/B boxes, one lane per rank."""
        return chrome_trace(self.comm, self.events or [], self._t0)
