"""The training configuration: one frozen dataclass, checked on construction, exposed as flags.

Every rank parses the same command line and builds the same :class:`TrainConfig`, so a bad value
fails identically everywhere *before* MPI starts; reported through :class:`mpi_sgd.args.ArgumentParser`
(``parser.parse_flags(TrainConfig)``, each field a ``--flag``), the root prints one message, every
rank exits with status 2, and no rank waits in a collective.

Longer than a module here usually is: each field's checks sit in one method beside the fields,
so that what a flag accepts reads in one place.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .amp import MODES as AMP_MODES
from .args import flag as _flag
from .checkpoint import check_writable, checkpoints, paths
from .checkpoint.storagefaults import save_fault
from .comm import BACKENDS, TORCH_BACKENDS
from .comm.wrappers.compress import DTYPES as COMPRESS_DTYPES
from .data import BUILTIN
from .gradsync import STRATEGIES
from .lateverdict import VERDICTS, late_conflicts
from .lrschedule import SCALINGS, SCHEDULES, parse_warmup
from .models import MODELS
from .report import check_output_file

OPTIMIZERS = ("sgd", "adam")
DTYPES = ("float32", "float64")
NONFINITE = ("stop", "skip")
AUTO = ("auto", "auto-or-fresh")  # --resume: the newest valid checkpoint in --checkpoint


@dataclass(frozen=True)
class TrainConfig:
    model: str = _flag("simplenet", f"model to train: {', '.join(MODELS)}")
    dataset: str = _flag("digits", f"built-in dataset ({', '.join(BUILTIN)}) or a .npz/.pt file with arrays x, y")
    val_fraction: float = _flag(
        0.1, "fraction of the samples held out for validation, the same on every rank (0: none)"
    )
    epochs: int = _flag(8, "passes over the dataset")
    batch_size: int = _flag(32, "samples per rank per step, B; the effective batch is R*B")
    grad_accum: int = _flag(1, "micro-batches per step (must divide --batch-size); one gradient sync per step")
    lr: float = _flag(0.05, "learning rate")
    momentum: float = _flag(0.9, "SGD momentum (ignored by adam)")
    optimizer: str = _flag("sgd", f"optimizer: {', '.join(OPTIMIZERS)}")
    strategy: str = _flag("bucketed", f"gradient averaging: {', '.join(STRATEGIES)}")
    bucket_mb: float = _flag(1.0, "bucket size in MB for --strategy bucketed")
    zero: int = _flag(
        0, "ZeRO stage: 0 off; 1 shards optimizer state, 2 also gradients, 3 also parameters (replaces --strategy)"
    )
    seed: int = _flag(0, "seed for model initialisation, data order and synthetic data")
    device: str = _flag("cpu", "torch device, e.g. cpu or cuda")
    backend: str = _flag("mpi4py", f"communicator: {', '.join(BACKENDS)}")
    dtype: str = _flag("float32", f"parameter and data dtype: {', '.join(DTYPES)}")
    amp: str = _flag("none", "mixed precision: none, bf16 (autocast) or fp16 (autocast and a gradient scaler)")
    compress: str = _flag(
        "none", "all-reduce gradients in 16 bits: none, fp16 or bf16 (error bound in mpi_sgd/comm/wrappers/compress.py)"
    )
    max_steps: int = _flag(0, "stop after this many optimizer steps in total (0: run all epochs)")
    checkpoint: str | None = _flag(
        None,
        "directory to write checkpoints into (root rank, atomically, checksummed) after each epoch and at the end",
        str,
    )
    checkpoint_every: int = _flag(0, "also checkpoint every this many steps within an epoch (0: at epoch ends only)")
    keep_checkpoints: int = _flag(3, "how many of the newest checkpoints to keep in --checkpoint (0: all)")
    resume: str | None = _flag(
        None,
        "resume from this checkpoint (a --checkpoint directory or one step-N in it); 'auto': the newest "
        "valid one in --checkpoint, a fresh start if there is none, refused if there are some but none can be "
        "read; 'auto-or-fresh': a fresh start then too",
        str,
    )
    on_nonfinite: str = _flag(
        "stop",
        "a non-finite loss or gradient on any rank: 'stop' every rank at that step (non-zero exit), or "
        "'skip' the step on every rank",
    )
    nonfinite_verdict: str = _flag(
        "auto",
        "when that verdict reaches the host: 'now' (each step waits for it), 'next-step' (a bad step is "
        "skipped on the device and reported after the next one; no wait per step), 'auto': next-step on GPUs",
    )
    check_every: int = _flag(
        100, "compare a checksum of the parameters across ranks every this many steps, and at the end (0: end only)"
    )
    metrics_json: str | None = _flag(None, "write loss, accuracy and per-step t_comp/t_sync here as JSON", str)
    timeline: str | None = _flag(
        None, "write a Chrome trace of every rank's forward, backward, allreduce, optimizer here", str
    )
    stall_timeout: float | None = _flag(
        None,
        "seconds a rank may wait in one collective before the job names the missing ranks, prints every rank's "
        "stack and aborts (None: $MPI_SGD_STALL_TIMEOUT, else 60; 0: no watchdog)",
        float,
    )
    stall_abort: float | None = _flag(
        None, "abort once a rank has waited this long (None: at the stall timeout; 0: report only)", float
    )
    save_timeout: float = _flag(
        600.0,
        "seconds one checkpoint save (or the read of one to resume) may take; the watchdog waits for it that "
        "long, and a save still writing then is reported as hung, naming the path, and ends the job (0: no limit)",
    )
    lr_scaling: str = _flag(
        "none", "scale --lr with the global batch R*B against --base-batch: none, linear (Goyal et al.) or sqrt"
    )
    base_batch: int = _flag(0, "the batch --lr was chosen for, for --lr-scaling and --adascale (0: --batch-size)")
    warmup: str = _flag("0", "raise the rate gradually over this many steps (500) or epochs (2ep), Goyal et al.")
    schedule: str = _flag("constant", f"learning-rate schedule after warm-up: {', '.join(SCHEDULES)}")
    adascale: bool = _flag(
        False, "AdaScale (Johnson et al. 2020): scale the rate by the gain the measured noise scale gives, each step"
    )
    noise_scale: bool = _flag(
        False, "measure the gradient noise scale B_noise (McCandlish et al. 2018) and report it per epoch"
    )
    target_val_loss: float | None = _flag(None, "stop once the held-out loss is at most this; report the time", float)
    target_val_accuracy: float | None = _flag(
        None, "stop once the held-out accuracy is at least this; report the time to it", float
    )
    eval_every: int = _flag(0, "also score the held-out set for the target every this many steps (0: per epoch)")
    progress: bool | None = _flag(
        None,
        "progress bar on the root rank: --progress always, --no-progress never; by default only on a terminal",
        bool,
    )

    def __post_init__(self):
        def check(ok: bool, message: str):
            if not ok:
                raise ValueError(message)

        check(self.model in MODELS, f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        check(
            self.dataset in BUILTIN or self.dataset.endswith((".npz", ".pt")),
            f"unknown dataset {self.dataset!r}; choose one of {', '.join(BUILTIN)} or give a .npz/.pt file",
        )
        check(
            self.strategy in STRATEGIES,
            f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}",
        )
        check(
            self.optimizer in OPTIMIZERS,
            f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}",
        )
        check(self.backend in BACKENDS, f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        check(self.dtype in DTYPES, f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        check(self.amp in AMP_MODES, f"unknown --amp {self.amp!r}; choose one of {', '.join(AMP_MODES)}")
        check(self.amp == "none" or self.dtype == "float32", f"--amp {self.amp} needs --dtype float32")
        compress = ("none", *COMPRESS_DTYPES)
        check(self.compress in compress, f"unknown --compress {self.compress!r}; choose one of {', '.join(compress)}")
        check(self.epochs >= 1, f"--epochs must be at least 1, got {self.epochs}")
        check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        check(self.grad_accum >= 1, f"--grad-accum must be at least 1, got {self.grad_accum}")
        check(
            self.batch_size % self.grad_accum == 0,
            f"--grad-accum must divide --batch-size ({self.batch_size}), got {self.grad_accum}",
        )
        check(math.isfinite(self.lr) and self.lr > 0, f"--lr must be positive and finite, got {self.lr}")
        check(0 <= self.momentum < 1, f"--momentum must be in [0, 1), got {self.momentum}")
        check(self.bucket_mb > 0, f"--bucket-mb must be positive, got {self.bucket_mb}")
        check(self.zero in (0, 1, 2, 3), f"--zero must be 0, 1, 2 or 3, got {self.zero}")
        # ZeRO reduce-scatters gradients (CompressedComm carries all-reduces only), and each rank
        # holds only its shards' gradients, so an fp16 scaler would judge overflow per rank and the
        # ranks could disagree on skipping a step.
        check(
            not (self.zero and self.compress != "none"), "--compress applies to the all-reduce strategies, not --zero"
        )
        check(not (self.zero and self.amp == "fp16"), "--amp fp16 cannot be combined with --zero; use --amp bf16")
        check(self.resume in (None, *AUTO) or os.path.exists(self.resume), f"checkpoint {self.resume!r} does not exist")
        check(
            self.resume not in AUTO or bool(self.checkpoint),
            f"--resume {self.resume} needs --checkpoint DIR to look in",
        )
        save_fault()  # the test hook's variable, refused in one line when malformed (used or not)
        if self.checkpoint:
            check_writable(self.checkpoint)
            check(
                self.resume is not None or not checkpoints(self.checkpoint),
                f"--checkpoint {self.checkpoint!r} already holds checkpoints of another run; continue it with "
                "--resume auto, or choose another directory",
            )
            # Resuming from elsewhere into a directory of another run's checkpoints would interleave
            # two runs' steps there: latest, --resume auto and --keep-checkpoints would mix models.
            check(
                self.resume in (None, *AUTO)
                or paths.within(self.resume, self.checkpoint)
                or not checkpoints(self.checkpoint),
                f"--checkpoint {self.checkpoint!r} already holds checkpoints of another run, and --resume "
                f"{self.resume!r} is not one of them; write this run to an empty directory",
            )
        # Seeds are mixed with step and epoch numbers (seed * 1_000_003 + epoch) into torch's 64-bit seeds.
        check(0 <= self.seed < 2**32, f"--seed must be in [0, 2**32), got {self.seed}")
        check(self.checkpoint != "", "--checkpoint needs a directory (leave the flag out to save none)")
        outputs = {
            f: p for f, p in (("--metrics-json", self.metrics_json), ("--timeline", self.timeline)) if p is not None
        }
        for flag, path in outputs.items():
            check_output_file(path, flag)
            check(
                not (self.checkpoint and paths.owns(self.checkpoint, path)),
                f"{flag} {path!r} is inside what --checkpoint {self.checkpoint!r} saves replace; name a file elsewhere",
            )
        check(
            len(outputs) < 2 or os.path.realpath(self.metrics_json) != os.path.realpath(self.timeline),
            f"--metrics-json and --timeline name the same file {self.metrics_json!r}; each needs its own",
        )
        check(self.checkpoint_every >= 0, f"--checkpoint-every must be 0 or more, got {self.checkpoint_every}")
        check(not self.checkpoint_every or bool(self.checkpoint), "--checkpoint-every needs --checkpoint DIR")
        check(self.keep_checkpoints >= 0, f"--keep-checkpoints must be 0 or more, got {self.keep_checkpoints}")
        check(self.check_every >= 0, f"--check-every must be 0 or more, got {self.check_every}")
        check(
            self.on_nonfinite in NONFINITE,
            f"unknown --on-nonfinite {self.on_nonfinite!r}; choose one of {', '.join(NONFINITE)}",
        )
        check(
            self.nonfinite_verdict in VERDICTS,
            f"unknown --nonfinite-verdict {self.nonfinite_verdict!r}; choose one of {', '.join(VERDICTS)}",
        )
        conflict = late_conflicts(self) if self.nonfinite_verdict == "next-step" else None
        check(conflict is None, f"--nonfinite-verdict next-step cannot be used here: {conflict}; use now")
        check(self.max_steps >= 0, f"--max-steps must be 0 or more, got {self.max_steps}")
        for name in ("stall_timeout", "stall_abort", "save_timeout"):
            value = getattr(self, name)
            flag = "--" + name.replace("_", "-")
            check(value is None or 0 <= value < float("inf"), f"{flag} must be 0 or more seconds, got {value}")
        check(0 <= self.val_fraction < 1, f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        self._check_rates()

    def _check_rates(self) -> None:
        """The time-to-accuracy flags: learning-rate rules, noise scale and target."""
        problems = [
            (self.lr_scaling not in SCALINGS, f"unknown --lr-scaling {self.lr_scaling!r}; choose one of {SCALINGS}"),
            (self.schedule not in SCHEDULES, f"unknown --schedule {self.schedule!r}; choose one of {SCHEDULES}"),
            (self.base_batch < 0, f"--base-batch must be 0 or more, got {self.base_batch}"),
            (
                self.adascale and self.lr_scaling != "none",
                "--adascale scales the rate itself: leave --lr-scaling at none",
            ),
            (
                (self.noise_scale or self.adascale) and self.amp == "fp16",
                "--noise-scale and --adascale read gradient norms, which fp16's loss scaler changes: use --amp bf16",
            ),
            (
                self.target_val_loss is not None and self.target_val_accuracy is not None,
                "give one target: --target-val-loss or --target-val-accuracy",
            ),
            (
                (self.target_val_loss is not None or self.target_val_accuracy is not None) and not self.val_fraction,
                "a target is checked on the held-out set: --val-fraction must be above 0",
            ),
            (self.eval_every < 0, f"--eval-every must be 0 or more, got {self.eval_every}"),
            (
                self.eval_every > 0 and self.target_val_loss is None and self.target_val_accuracy is None,
                "--eval-every checks a target: give --target-val-loss or --target-val-accuracy",
            ),
        ]
        for bad, message in problems:
            if bad:
                raise ValueError(message)
        parse_warmup(self.warmup)
        for name in ("target_val_loss", "target_val_accuracy"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number, got {value}")

    def check_given(self, given) -> None:
        """Raise ValueError if a flag the command line gave (``given``, the names
        :meth:`mpi_sgd.args.ArgumentParser.given` returns) would be ignored by this configuration:
        a flag typed and silently dropped is a run the user did not ask for."""
        if self.zero and "strategy" in given:
            raise ValueError(
                f"--strategy {self.strategy} has no effect with --zero {self.zero}, which reduces gradients "
                "in its own units; give one of the two"
            )

    def check_machine(self, world_size: int) -> None:
        """Raise ValueError if this machine cannot run the configuration: its device or backend.

        Called by every rank before any communicator exists, so a missing GPU or a torch built
        without a backend is one message and exit status 2, not a traceback from every rank.
        """
        import torch

        from .comm import check_environment
        from .comm.backends import unavailable

        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise ValueError(f"unknown --device {self.device!r}; e.g. cpu, cuda, cuda:1") from None
        # The trainer runs on the CPU and CUDA only; torch names many more device types (mps, meta,
        # xpu, ...) that would fail later, each in its own way, inside the first step.
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"--device {self.device}: the trainer runs on cpu or cuda, not {device.type}")
        if device.type == "cuda" and not torch.cuda.is_available():
            why = "this torch is a CPU build" if torch.version.cuda is None else "no GPU is visible"
            raise ValueError(f"--device {self.device}: {why}; use --device cpu")
        if self.backend in TORCH_BACKENDS and unavailable(self.backend):
            raise ValueError(f"--backend {self.backend} is not available: {unavailable(self.backend)}")
        if self.backend == "nccl" and device.type != "cuda":
            raise ValueError("--backend nccl moves GPU memory only: add --device cuda")
        if self.backend == "torch-mpi4py" and device.type == "cuda":
            raise ValueError(
                "--backend torch-mpi4py hands MPI host memory only; with --device cuda use nccl, or mpi4py "
                "(which stages GPU tensors through pinned host memory)"
            )
        # mpi4py with --device cuda needs no check: init() stages GPU tensors through pinned host
        # memory where the MPI library is not CUDA-aware (mpi_sgd.comm.gpu, mpi_sgd.comm.wrappers.staged).
        check_environment(world_size)  # MPI_SGD_STALL_TIMEOUT, MPI_SGD_FAULT: as the flags are checked
        if (self.noise_scale or self.adascale) and world_size == 1 and (self.grad_accum < 2 or self.zero):
            raise ValueError(
                "--noise-scale at one process compares micro-batches with the step: give --grad-accum 2 or more "
                "(and no --zero), or run two or more ranks"
            )
        if self.backend == "local" and world_size > 1:
            raise ValueError(f"--backend local is one process, but this job has {world_size}; use mpi4py or gloo")
