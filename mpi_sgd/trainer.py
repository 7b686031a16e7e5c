"""The synchronous SGD training loop, one small class around :func:`~mpi_sgd.step.train_step`.

Per step, every rank runs forward and backward on its own B samples (split into ``grad_accum``
micro-batches), the gradient strategy averages the gradients over all R ranks, and every rank
applies the same optimizer step to the same parameters: one step of SGD at batch R*B. Per
epoch, with N samples ([S-SGD]):

    T_epoch = N / (R*B) * (T_comp + T_sync)

and both terms are measured for every step: ``t_sync`` is the time the step spent blocked in
gradient communication (``GradSync.seconds``), ``t_comp`` the rest of the step (forward,
backward, optimizer). Distributed training pays off when T_sync / T_comp < R - 1.

After each epoch the model is scored on the held-out ``val`` set (dropout off): each rank takes an
even share, and the sums travel in the epoch's one small all-reduce, so validation costs no message.
The loop and its measurements live here; saving and resuming in :mod:`mpi_sgd.resumption`, what a
non-finite step is blamed on in :func:`mpi_sgd.nonfinite.diagnose`.

Why over 300 lines: what is left here is the loop and what reads or changes the trainer's
own state at each step (skips, verdicts, checkpoints' hand-off); the rest already lives
apart (step.py, lateverdict.py, resumption.py, metrics.py, convergence.py).
"""

from __future__ import annotations

import math
import sys
import time

import torch
from tqdm import tqdm

from . import agree, data, gradsync, resumption, zero
from . import metrics as run_metrics  # (the module; Trainer.metrics is the method)
from .amp import HOPELESS_OVERFLOWS, MixedPrecision
from .checkpoint import hold
from .comm import split_counts
from .config import TrainConfig
from .convergence import Convergence
from .gcpause import frozen_heap
from .gradsync import GradSync
from .lateverdict import LateVerdict, wanted
from .launchers import processes_line
from .models import build_model
from .nonfinite import describe, diagnose
from .preemption import Preempted, Preemption
from .replicas import replicate
from .step import Step, TrainingDiverged, evaluate, make_optimizer, train_step
from .timing import chrome_trace

__all__ = ["MAX_SKIPS_IN_A_ROW", "Step", "Trainer", "TrainingDiverged", "make_optimizer", "train_step"]

MAX_SKIPS_IN_A_ROW = 10  # --on-nonfinite skip: this many non-finite steps in a row stop training


class Trainer:
    """Synchronous SGD on ``comm``: ``train()`` runs epochs of :func:`train_step`.

    ``model`` must start identical on every rank (see :func:`mpi_sgd.replicas.replicate`)
    and ``sync`` be the gradient strategy built for it; the trainer zeroes gradients through
    ``sync``, since flat and bucketed gradients are views that ``optimizer.zero_grad()`` would drop.
    :meth:`from_config` builds all of that from a :class:`TrainConfig`. ``val``, if given, is
    scored after every epoch (see :func:`mpi_sgd.data.prepare` for the split).
    """

    def __init__(
        self,
        model,
        optimizer,
        sync: GradSync,
        dataset: data.Dataset,
        comm,
        cfg: TrainConfig,
        val: data.Dataset | None = None,
    ):
        self.model, self.optimizer, self.sync, self.comm, self.cfg = model, optimizer, sync, comm, cfg
        self.dataset, self.val = dataset, val
        self.steps_per_epoch = data.check_size(len(dataset), comm.size, cfg.batch_size)
        self.epoch = self.step_in_epoch = self.step = 0
        self.epoch_offset = 0  # samples of this epoch trained before its steps began (a resume at another R)
        self.skipped = 0  # steps left out by --on-nonfinite skip
        self.skipped_in_a_row, self._last_skipped = 0, -1
        self.t_comp: list[float] = []
        self.t_sync: list[float] = []
        self.history: list[dict] = []
        self.counters: list[tuple] = []  # per-epoch values for the timeline's counter tracks
        self.preemption, self.signalled = None, 0  # in train(): SIGTERM/SIGUSR1 caught, and agreed
        self._last_save = (-1, False)  # (step, written) of this job's last save
        self.events = sync.events  # shared with the strategy, which adds its allreduces
        self.amp = MixedPrecision(cfg.amp, next(model.parameters()).device.type)
        if cfg.amp == "fp16":
            # fp16's scaled gradients overflow now and then by design; the scaler skips those steps
            # on every rank alike, so the non-finite stop would misread them as divergence
            # (_on_overflow tells the two apart).
            sync.check_finite = False
        late = wanted(cfg, next(model.parameters()).device.type) and getattr(optimizer, "defaults", {}).get("fused")
        self.late = LateVerdict() if late else None  # verdicts read a step late (mpi_sgd.lateverdict)
        # rates, noise scale, target; a schedule spans --epochs (--max-steps only cuts a run short)
        self.conv = Convergence(cfg, comm, sync, self.steps_per_epoch, cfg.epochs * self.steps_per_epoch)
        if self.events is not None:
            comm.barrier()  # so every rank's timeline starts from (nearly) the same instant
        self._t0 = time.perf_counter()

    @classmethod
    def from_config(cls, cfg: TrainConfig, dataset: data.Dataset, comm, val: data.Dataset | None = None) -> Trainer:
        """``cfg.model`` trained on ``dataset`` (already in its dtype, on its device), one replica per rank.

        The same seed on every rank gives the same initial model; the broadcast from rank 0 makes it
        certain. Afterwards each rank reseeds with ``seed + rank``, since dropout masks must differ.
        Before the broadcast, the first collective whose shape depends on them, the ranks compare
        their configurations and data (:func:`mpi_sgd.agree.check_start`), and then their gradient
        buckets (:func:`mpi_sgd.agree.check_layout`).
        """

        def build():
            model = build_model(cfg.model, tuple(dataset.x.shape[1:]), dataset.num_outputs)
            return model.to(dataset.x.device, dataset.x.dtype)

        def check():
            processes = agree.check_start(comm, cfg, dataset, val)
            if comm.is_root:  # flushed now: a rank killed later takes unflushed output with it
                print(processes_line(processes), flush=True)

        model = replicate(build, comm, cfg.seed, check)
        if cfg.checkpoint:  # one job per directory, for this job's life (mpi_sgd.checkpoint.lock)
            hold(cfg.checkpoint, comm)
        events = [] if cfg.timeline else None
        if cfg.zero:  # sharded data parallel: the optimizer steps on this rank's shards only
            sync, optimizer = zero.make(cfg.zero, model, comm, lambda shards: make_optimizer(cfg, shards), events)
        else:  # (ZeroEngine compares its own units across ranks)
            optimizer = make_optimizer(cfg, model, fused=wanted(cfg, dataset.x.device.type))
            sync = gradsync.make(cfg.strategy, model, comm, cfg.bucket_mb, events, compress=cfg.compress)
            agree.check_layout(comm, sync)
        return cls(model, optimizer, sync, dataset, comm, cfg, val=val)

    def _run_batch(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One step on this rank's batch, its times kept; returns (loss sum, correct, samples) to log,
        zeros for a step left out because some rank's loss or gradient was not finite."""
        self.comm.where("batch", self.step + 1)  # steps count from 1, as a stall report names them
        self.conv.before_step(self.optimizer)
        late = self.late is not None
        step = train_step(self.model, self.optimizer, self.sync, x, y, self.cfg.grad_accum, self.amp, late=late)
        self.conv.after_step(step.finite)
        self.t_comp.append(step.t_comp)
        self.t_sync.append(step.t_sync)
        if late:  # the previous step's verdict, already on the host (its stats were zeroed on the device)
            self._on_late(self.late.push(self.step + 1, self.epoch, step.verdict, step.raw_stats, self.sync))
            return step.stats
        if not step.finite:  # the same verdict on every rank, at the same step
            self._on_nonfinite(step.stats[0].item() / max(step.stats[2].item(), 1), self.step + 1, self.sync)
            return torch.zeros_like(step.stats)
        if step.overflowed:  # fp16's scaler skipped it: a loss of inf or NaN is not the epoch's loss
            self._on_overflow(step.stats[0].item() / max(step.stats[2].item(), 1))
            return torch.zeros_like(step.stats)
        return step.stats

    def _on_overflow(self, loss: float) -> None:
        """After a step fp16's scaler skipped (on every rank alike: it judged the averaged gradients).
        Skips are its way of finding its factor; a loss that was not finite in the forward pass is
        not: no factor helps it (the scaling comes after), so that is a non-finite step like any
        other, stopped or skipped by --on-nonfinite. Run on every rank; costs one small gather."""
        where = f"in step {self.step + 1} (epoch {self.epoch})"
        everyone = self.comm.allgather_obj((loss, True, False, None))
        if not all(math.isfinite(v) for v, *_ in everyone):
            self._on_nonfinite(loss, self.step + 1, self.sync, what=describe(everyone, where))
            return
        amp = self.amp
        if amp.overflows_in_a_row < HOPELESS_OVERFLOWS and all(
            torch.isfinite(p).all() for p in self.model.parameters()
        ):
            return
        raise TrainingDiverged(
            f"training diverged: --amp fp16's gradient scaler skipped {amp.overflows_in_a_row} step(s) in a row "
            f"to step {self.step + 1} (its factor now {amp.scaler.get_scale():g}), or the parameters are not "
            f"finite; try a lower --lr than {self.cfg.lr}, or --amp bf16"
        )

    def _on_late(self, bad) -> None:
        if bad is not None:
            self._on_nonfinite(bad.loss, bad.step, bad.kept, bad.epoch)

    def _settle(self) -> None:
        """Where the host must know: read a late verdict still pending (a wait, once per epoch)."""
        if self.late is not None:
            self._on_late(self.late.flush())

    def _run_epoch(self, epoch: int) -> None:
        cfg, comm = self.cfg, self.comm
        n, offset = len(self.dataset), self.epoch_offset  # offset: see resumption.carry_on
        batches = data.rank_batches(n, comm.rank, comm.size, cfg.batch_size, epoch, cfg.seed, offset)
        self.steps_this_epoch = len(batches)
        # On the data's device, as train_step's are: NCCL reduces only GPU tensors.
        stats = torch.zeros(3, dtype=torch.float64, device=self.dataset.x.device)
        started = time.perf_counter()
        # A bar of \r updates is for a terminal; in a log file it is noise (under mpiexec, rank 0's
        # output reaches the terminal through a pipe, so the default shows none: --progress forces it).
        show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
        bar = tqdm(
            range(self.step_in_epoch, self.steps_this_epoch),
            desc=f"epoch {epoch}",
            leave=False,
            disable=not (comm.is_root and show),
        )
        for s in bar:
            idx = batches[s]
            stats += self._run_batch(self.dataset.x[idx], self.dataset.y[idx])
            self.step += 1
            self.step_in_epoch = s + 1
            if cfg.check_every and self.step % cfg.check_every == 0:
                self._check_replicas()
            if show and comm.is_root and s % 10 == 0 and stats[2] > 0:  # (reading stats waits for a GPU)
                bar.set_postfix(loss=f"{stats[0].item() / stats[2].item():.4f}")
            if self.conv.eval_due(self.step):  # every rank alike: the scores come out of one all-reduce
                self._settle()
                self._score_target()
            self.signalled = self.preemption.agreed(self.step) if self.preemption else 0  # SIGTERM, SIGUSR1
            every = cfg.checkpoint_every
            if cfg.checkpoint and every and self.step % every == 0 and s + 1 < self.steps_this_epoch:
                self._settle()
                self._save_checkpoint(cfg.checkpoint)  # (the epoch's end saves anyway)
            if self._done():
                break
        bar.close()
        self._settle()
        # Loss and accuracy over all R*B samples of the epoch and over the held-out set: one small
        # all-reduce per epoch.
        self.comm.where("evaluate")
        stats = torch.cat([stats, self._evaluate(), self.conv.epoch_sums(stats.device)])
        comm.allreduce(stats, "sum")
        loss, correct, n, val_loss, val_correct, val_n = stats[:6].tolist()
        classification = self.dataset.classification
        # NaN where every step of the epoch was left out: no sample counted (JSON: null)
        row = {"epoch": epoch, "loss": loss / n if n else math.nan, "seconds": time.perf_counter() - started}
        row["accuracy"] = (correct / n if n else math.nan) if classification else None
        row["val_loss"] = val_loss / val_n if val_n else None
        row["val_accuracy"] = val_correct / val_n if val_n and classification else None
        row["skipped"] = self.skipped
        row["overflows"] = self.amp.overflows
        row.update(self.conv.epoch_row(stats[6:].tolist()))
        if self.events is not None:  # the timeline's counter tracks: what changed over this epoch
            values = {k: row[k] for k in ("b_noise", "lr") if row.get(k) is not None}
            self.counters += [("statistics", time.perf_counter(), values)] if values else []
        self.conv.check_target(row, self.step, time.perf_counter() - self._t0)
        self.history.append(row)
        if comm.is_root:
            text = f"epoch {epoch:3d}  loss {row['loss']:.4f}"
            text += f"  accuracy {row['accuracy']:.3f}" if classification else ""
            text += f"  val loss {row['val_loss']:.4f}" if val_n else ""
            text += f"  val accuracy {row['val_accuracy']:.3f}" if val_n and classification else ""
            text += f"  B_noise {row['b_noise']:.4g}" if row.get("b_noise") is not None else ""
            print(f"{text}  ({row['seconds']:.2f} s)", flush=True)

    def _on_nonfinite(self, loss: float, step: int, flag, epoch: int | None = None, what: str | None = None) -> None:
        """Every rank is here for the same step (see :func:`train_step`; a late verdict's step is the
        one before): name the ranks whose loss or gradient was not finite, then stop (raise
        :class:`TrainingDiverged` on every rank alike) or, with ``--on-nonfinite skip``, go on without it."""
        where = f"in step {step} (epoch {self.epoch if epoch is None else epoch})"
        what = diagnose(self.comm, flag, loss, where) if what is None else what
        # Skipping helps with a bad batch; not once the parameters themselves are the cause (then
        # every later step fails as well, since skipped steps leave them as they are).
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if self._last_skipped == step - 1 else 1
        self._last_skipped = step
        hopeless = self.skipped_in_a_row >= MAX_SKIPS_IN_A_ROW or not all(
            torch.isfinite(p).all() for p in self.model.parameters()
        )
        if self.cfg.on_nonfinite == "skip" and not hopeless:
            self.skipped += 1
            if self.comm.is_root:
                print(f"skipped step {step} on every rank: {what}", file=sys.stderr, flush=True)
            return
        hint = ""
        if self.cfg.on_nonfinite == "skip":
            hint = f"; skipping cannot help: {self.skipped_in_a_row} steps in a row, or parameters not finite"
        raise TrainingDiverged(f"training diverged: {what}{hint}; try a lower --lr than {self.cfg.lr}")

    def _evaluate(self) -> torch.Tensor:
        """(loss sum, correct, samples) of this rank's share of ``val``, dropout off; zeros without one."""
        if self.val is None:
            return torch.zeros(3, dtype=torch.float64, device=self.dataset.x.device)
        counts = split_counts(len(self.val), self.comm.size)
        start = sum(counts[: self.comm.rank])
        mine = slice(start, start + counts[self.comm.rank])
        return evaluate(self.model, self.val.x[mine], self.val.y[mine])

    def _score_target(self) -> None:
        """Score the held-out set now (one small all-reduce) and check the target: ``--eval-every``."""
        self.comm.where("evaluate")
        t0 = time.perf_counter()
        stats = self._evaluate()
        self.comm.allreduce(stats, "sum")
        val_loss, val_correct, val_n = stats.tolist()
        row = {"val_loss": val_loss / val_n, "val_accuracy": val_correct / val_n}
        self.conv.eval_seconds += time.perf_counter() - t0  # reported beside the time to the target
        self.conv.check_target(row, self.step, time.perf_counter() - self._t0)

    def _check_replicas(self) -> None:
        # ZeRO stage 3 holds no replica: each rank keeps its own shard of the parameters.
        if getattr(self.sync, "stage", 0) != 3:
            agree.check_replicas(self.comm, self.model, self.step)

    def _done(self) -> bool:
        return 0 < self.cfg.max_steps <= self.step or self.conv.reached or bool(self.signalled)

    def train(self) -> dict:
        cfg = self.cfg
        for line in self.conv.describe() if self.comm.is_root else ():
            print(line, flush=True)
        with Preemption(self.comm, self.dataset.x.device) as self.preemption, frozen_heap():
            while self.epoch < cfg.epochs and not self._done():
                self._run_epoch(self.epoch)
                if self.step_in_epoch == self.steps_this_epoch:
                    self.epoch, self.step_in_epoch, self.epoch_offset = self.epoch + 1, 0, 0
                if cfg.checkpoint:  # after each epoch, and the step a signal stopped at
                    self.comm.where("checkpoint")
                    self._save_checkpoint(cfg.checkpoint)
        self.preemption = None
        if self.signalled:
            saved = self._last_save == (self.step, True)
            raise Preempted(self.signalled, self.step, cfg.checkpoint if saved else None, cfg.checkpoint)
        self._check_replicas()  # silent divergence cannot pass
        if getattr(self.sync, "stage", 0) == 3:  # ZeRO-3: a whole model again for whoever uses it next
            self.sync.keep_gathered()
        if self.conv.target is not None and self.comm.is_root:
            print(self.conv.target.line(self.time_to_target()), flush=True)
        if (note := self.conv.unfinished()) and self.comm.is_root:
            print(note, flush=True)
        return self.metrics()

    def time_to_target(self) -> dict | None:
        """Steps, samples, epochs and seconds to ``--target-val-*``, or how far the run got (None: no target)."""
        if self.conv.target is None:
            return None
        return self.conv.target.summary(self.step, time.perf_counter() - self._t0)

    # -- checkpoints (mpi_sgd.resumption) -------------------------------------------------
    def _save_checkpoint(self, directory: str) -> None:
        # Not the same state twice: a save mid-epoch (--checkpoint-every), then the loop ended at
        # that very step (a signal, --max-steps, the target) would write it again over itself.
        if self._last_save[0] != self.step:
            self._last_save = (self.step, resumption.save(self, directory))

    def load_checkpoint(self, path: str, auto: bool | str = False, given=frozenset()) -> str | None:
        """Resume from ``path``; the checkpoint used, or None (see :func:`mpi_sgd.resumption.load`)."""
        used = resumption.load(self, path, auto, given)
        if self.late is not None:  # a saved optimizer brings its groups' options: keep the fused step
            for group in self.optimizer.param_groups:
                group.update(fused=True, foreach=None)
        return used

    # -- measurements -----------------------------------------------------------------------
    def metrics(self) -> dict:
        """What ``--metrics-json`` writes, on the root (``{}`` elsewhere): see :func:`mpi_sgd.metrics.collect`."""
        return run_metrics.collect(self)

    def timeline(self) -> dict | None:
        """Every rank's events as a Chrome trace (chrome://tracing, ui.perfetto.dev); root only.

        One complete event (``"ph": "X"``) per forward, backward, optimizer step and all-reduce
        (``allreduce[i]`` per bucket), ``tid`` = rank, ``ts``/``dur`` in microseconds since the
        ranks left a common barrier when the trainer was made.
        """
        return chrome_trace(self.comm, self.events or [], self._t0, self.counters)
