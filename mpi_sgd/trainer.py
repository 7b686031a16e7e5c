"""The synchronous SGD training loop, one small class.

Per step, every rank runs forward and backward on its own B samples (split into ``grad_accum``
micro-batches), the gradient strategy averages the gradients over all R ranks, and every rank
applies the same optimizer step to the same parameters: one step of SGD at batch R*B. Per
epoch, with N samples ([S-SGD]):

    T_epoch = N / (R*B) * (T_comp + T_sync)

and both terms are measured for every step: ``t_sync`` is the time the step spent blocked in
gradient communication (``GradSync.seconds``), ``t_comp`` the rest of the step (forward,
backward, optimizer). Distributed training pays off when T_sync / T_comp < R - 1.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict

import torch
from torch.nn import functional as F
from tqdm import tqdm

from . import checkpoint, data
from .config import TrainConfig
from .gradsync import GradSync
from .timeline import chrome_trace

WARMUP_STEPS = 5  # left out of the timing summary: first steps pay for allocation and caches


def make_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)


class Trainer:
    """Synchronous SGD on ``comm``: ``train()`` runs epochs of :meth:`_run_batch` steps.

    ``model`` must start identical on every rank (see :func:`mpi_sgd.gradsync.broadcast_parameters`)
    and ``sync`` be the gradient strategy built for it; the trainer zeroes gradients through
    ``sync``, since flat and bucketed gradients are views that ``optimizer.zero_grad()`` would drop.
    """

    def __init__(self, model, optimizer, sync: GradSync, dataset: data.Dataset, comm, cfg: TrainConfig):
        self.model, self.optimizer, self.sync, self.comm, self.cfg = model, optimizer, sync, comm, cfg
        self.dataset = dataset
        self.loss_fn = F.cross_entropy if dataset.classification else F.mse_loss
        self.steps_per_epoch = data.check_size(len(dataset), comm.size, cfg.batch_size)
        self.epoch = self.step_in_epoch = self.step = 0
        self.t_comp: list[float] = []
        self.t_sync: list[float] = []
        self.history: list[dict] = []
        self.events = sync.events  # shared with the strategy, which adds its allreduces
        if self.events is not None:
            comm.barrier()  # so every rank's timeline starts from (nearly) the same instant
        self._t0 = time.perf_counter()

    def _record(self, name: str, start: float, end: float) -> None:
        if self.events is not None:
            self.events.append((name, start, end - start))

    def _run_batch(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step on this rank's batch; returns (loss sum, correct, samples) to log."""
        k = self.cfg.grad_accum
        start = time.perf_counter()
        self.sync.seconds = 0.0
        self.sync.zero_grad()
        stats = torch.zeros(3, dtype=torch.float64)
        for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k), strict=True)):
            with self.sync.accumulate(last=i == k - 1):
                t0 = time.perf_counter()
                out = self.model(xm)
                loss = self.loss_fn(out, ym)
                t1 = time.perf_counter()
                # mean over B/k samples, divided by k: the k micro-batches sum to the mean over B
                (loss * (self.sync.loss_scale / k)).backward()
                self._record("forward", t0, t1)
                self._record("backward", t1, time.perf_counter())
            with torch.no_grad():
                stats[0] += loss.detach().double() * len(ym)
                if self.dataset.classification:
                    stats[1] += (out.argmax(1) == ym).sum()
                stats[2] += len(ym)
        self.sync.wait()
        t0 = time.perf_counter()
        self.optimizer.step()
        end = time.perf_counter()
        self._record("optimizer", t0, end)
        self.t_sync.append(self.sync.seconds)
        self.t_comp.append(end - start - self.sync.seconds)
        return stats

    def _run_epoch(self, epoch: int) -> None:
        cfg, comm = self.cfg, self.comm
        batches = data.rank_batches(len(self.dataset), comm.rank, comm.size, cfg.batch_size, epoch, cfg.seed)
        stats = torch.zeros(3, dtype=torch.float64)
        started = time.perf_counter()
        bar = tqdm(
            range(self.step_in_epoch, self.steps_per_epoch),
            desc=f"epoch {epoch}",
            leave=False,
            disable=not (comm.is_root and cfg.progress),
        )
        for s in bar:
            idx = batches[s]
            stats += self._run_batch(self.dataset.x[idx], self.dataset.y[idx])
            self.step += 1
            self.step_in_epoch = s + 1
            if comm.is_root and s % 10 == 0:
                bar.set_postfix(loss=f"{stats[0].item() / stats[2].item():.4f}")
            if self._done():
                break
        bar.close()
        # Loss and accuracy over all R*B samples of the epoch: one small all-reduce per epoch.
        comm.allreduce(stats, "sum")
        loss, correct, n = stats.tolist()
        row = {"epoch": epoch, "loss": loss / max(n, 1), "seconds": time.perf_counter() - started}
        row["accuracy"] = correct / max(n, 1) if self.dataset.classification else None
        self.history.append(row)
        if comm.is_root:
            acc = f"  accuracy {row['accuracy']:.3f}" if row["accuracy"] is not None else ""
            print(f"epoch {epoch:3d}  loss {row['loss']:.4f}{acc}  ({row['seconds']:.1f} s)", flush=True)

    def _done(self) -> bool:
        return 0 < self.cfg.max_steps <= self.step

    def train(self) -> dict:
        cfg = self.cfg
        while self.epoch < cfg.epochs and not self._done():
            self._run_epoch(self.epoch)
            if self.step_in_epoch == self.steps_per_epoch:
                self.epoch, self.step_in_epoch = self.epoch + 1, 0
            if cfg.checkpoint:
                self._save_checkpoint(cfg.checkpoint)
        return self.metrics()

    # -- checkpoints ------------------------------------------------------------------------
    def _save_checkpoint(self, path: str) -> None:
        # Every rank's RNG state (dropout masks differ per rank), so a resume is bit-exact.
        rng = self.comm.gather_obj(torch.get_rng_state())
        if self.comm.is_root:
            state = {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch,
                "step": self.step,
                "world_size": self.comm.size,
                "rng": rng,
            }
            checkpoint.save_atomic(state, path)

    def load_checkpoint(self, path: str) -> None:
        state = checkpoint.load(path, self.comm)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch, self.step_in_epoch, self.step = state["epoch"], state["step_in_epoch"], state["step"]
        if state["world_size"] == self.comm.size:
            torch.set_rng_state(state["rng"][self.comm.rank])
            return
        # A different world size: training goes on correctly but not bit for bit. Each rank gets a
        # fresh dropout stream, and an epoch cut at the old R*B cannot be continued at the new one,
        # so an interrupted epoch is left and the next one starts.
        torch.manual_seed(self.cfg.seed + self.comm.rank + 1_000_003 * self.step)
        if self.step_in_epoch:
            self.epoch, self.step_in_epoch = self.epoch + 1, 0

    # -- measurements -----------------------------------------------------------------------
    def metrics(self) -> dict:
        """What ``--metrics-json`` writes (on the root; other ranks get ``{}``). Times in seconds.

        * ``world_size``, ``backend``, ``effective_batch`` (R*B), ``steps_per_epoch``, ``steps``
          (optimizer steps done, counting those before a resume), ``config`` (every flag);
        * ``epochs``: ``[{"epoch", "loss", "accuracy" (null for regression), "seconds"}]``, loss and
          accuracy averaged over all R*B samples of every step of the epoch;
        * ``t_comp``, ``t_sync``: one list per rank (index = rank), one entry per step run by this
          launch: ``t_sync`` the time blocked in gradient communication, ``t_comp`` the rest of the
          step (forward, backward, optimizer), so ``t_comp + t_sync`` is the step time;
        * ``summary``: ``{"t_comp", "t_sync"}``, per step the slowest rank, averaged over the steps
          after the first ``warmup_steps``.
        """
        per_rank = self.comm.gather_obj((self.t_comp, self.t_sync))
        if not self.comm.is_root:
            return {}
        t_comp = [r[0] for r in per_rank]
        t_sync = [r[1] for r in per_rank]
        summary = {}
        for name, series in (("t_comp", t_comp), ("t_sync", t_sync)):
            # per step, the slowest rank sets the pace; then the mean over steps after warm-up
            slowest = [max(v) for v in zip(*series, strict=True)][WARMUP_STEPS:] or [
                max(v) for v in zip(*series, strict=True)
            ]
            summary[name] = statistics.fmean(slowest) if slowest else 0.0
        return {
            "world_size": self.comm.size,
            "backend": self.comm.backend,
            "effective_batch": self.comm.size * self.cfg.batch_size,
            "steps_per_epoch": self.steps_per_epoch,
            "steps": self.step,
            "config": asdict(self.cfg),
            "epochs": self.history,
            "summary": summary,
            "warmup_steps": WARMUP_STEPS,
            "t_comp": t_comp,
            "t_sync": t_sync,
        }

    def timeline(self) -> dict | None:
        """Every rank's events as a Chrome trace (chrome://tracing, ui.perfetto.dev); root only.

        One complete event (``"ph": "X"``) per forward, backward, optimizer step and all-reduce
        (``allreduce[i]`` per bucket), ``tid`` = rank, ``ts``/``dur`` in microseconds since the
        ranks left a common barrier when the trainer was made.
        """
        return chrome_trace(self.comm, self.events or [], self._t0)


def write_json(obj, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
