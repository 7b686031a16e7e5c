"""What every rank must share, checked: the configuration before training, the replicas during it.

MPI checks none of this. Ranks started with another ``--lr`` or ``--seed`` train on and end with
replicas that differ; another ``--epochs`` leaves one rank waiting for a step the others never
take; another bucket layout pairs non-blocking all-reduces of different lengths, which MPI sums
into garbage without a word. So:

* :func:`check_start`, once before the first collective that depends on them: every rank's
  configuration and a fingerprint of its data travel in one small all-gather (a pickled control
  message, once per job), and :func:`check_layout` does the same for the gradient-bucket layout
  once the strategy is built; any difference stops every rank with the same message naming the
  field and the ranks;
* :func:`check_replicas`, every ``--check-every`` steps and at the end: a checksum of each rank's
  parameter *bits* is all-reduced with MAX over ``(c, -c)``, two integers, which yields the
  largest and the smallest checksum at once; they differ iff some replica differs (up to checksum
  collisions, which a sum of 32- or 64-bit patterns makes vanishingly unlikely for real divergence).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict

import torch

from .launch import JobError
from .launchers import process_id
from .report import ranks_text

# Flags that may differ between ranks: which GPU a rank uses, and whether it draws a progress bar.
LOCAL_FIELDS = ("progress",)
_MOD = 2**62  # checksums live in [0, 2**62), so -c fits an int64 too


class ConfigMismatch(JobError):
    """Ranks were started with different configurations, data or bucket layouts."""


class ReplicasDiverged(JobError):
    """The ranks' parameters are no longer bit-identical."""


def fingerprint(*tensors: torch.Tensor | None) -> str:
    """A short hash of the tensors' shapes, dtypes and bytes (blake2b)."""
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        t = t.detach().to("cpu").contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        # the bytes read in place (numpy's buffer), not copied out: a dataset can be gigabytes
        h.update(t.view(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return h.hexdigest()


def bucket_layout(sync) -> str:
    """The gradient all-reduces a step makes, in order: elements and dtype of each."""
    if hasattr(sync, "buckets"):
        sizes = [(sum(p.numel() for p in b.params), b.params[0].dtype) for b in sync.buckets]
    else:
        sizes = [(p.numel(), p.dtype) for p in sync.params]
    return " ".join(f"{n}:{str(d).removeprefix('torch.')}" for n, d in sizes)


def start_fields(cfg, dataset, val) -> dict[str, str]:
    """What must be the same on every rank, as strings: every flag and the data."""
    fields = {f"--{k.replace('_', '-')}": repr(v) for k, v in asdict(cfg).items() if k not in LOCAL_FIELDS}
    fields["--device"] = repr(torch.device(cfg.device).type)  # cuda:0 and cuda:1 are both fine
    fields["data"] = data_fingerprint(dataset, val)
    return fields


def data_fingerprint(dataset, val=None) -> str:
    """:func:`fingerprint` of a run's training and held-out sets (``val`` None: none held out)."""
    return fingerprint(dataset.x, dataset.y, *(() if val is None else (val.x, val.y)))


def compare(everyone: list[dict[str, str]]) -> list[str]:
    """One line per field on which the ranks differ: 'FIELD: V1 on ranks 0, 2; V2 on rank 1'."""
    problems = []
    for key in dict.fromkeys(k for fields in everyone for k in fields):
        by_value: dict[str, list[int]] = {}
        for rank, fields in enumerate(everyone):
            by_value.setdefault(fields.get(key, "(absent)"), []).append(rank)
        if len(by_value) > 1:
            parts = [f"{_short(v)} on {ranks_text(r)}" for v, r in by_value.items()]
            problems.append(f"{key}: {'; '.join(parts)}")
    return problems


def check_start(comm, cfg, dataset, val) -> list[str]:
    """Raise :class:`ConfigMismatch` on every rank alike if the ranks' flags or data differ.

    Returns every rank's process as ``PID@HOST`` (:func:`mpi_sgd.launchers.process_id`), by rank: the
    same all-gather carries it, for the start line that maps a launcher's PIDs to ranks.
    """
    everyone = comm.allgather_obj((start_fields(cfg, dataset, val), process_id()))
    _raise_if(compare([fields for fields, _ in everyone]))
    return [process for _, process in everyone]


def check_layout(comm, sync) -> None:
    """Raise :class:`ConfigMismatch` on every rank alike if the gradient all-reduces differ."""
    _raise_if(compare(comm.allgather_obj({"gradient buckets": bucket_layout(sync)})))


def _raise_if(problems: list[str]) -> None:
    if problems:
        raise ConfigMismatch(
            "ranks disagree before training, so none trains: "
            + " | ".join(problems)
            + "; start every rank with the same flags and data"
        )


def checksum(params) -> int:
    """A checksum of the parameters' bits: each tensor's bit patterns summed as integers, weighted by
    its position. Bit-exact: any single changed bit changes it."""
    total = 0
    for i, p in enumerate(params, start=1):
        t = p.detach().reshape(-1)
        bits = {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]
        total += i * int(t.view(bits).sum(dtype=torch.int64))
    return total % _MOD


def check_replicas(comm, model, step: int) -> None:
    """Raise :class:`ReplicasDiverged` on every rank alike unless all replicas are bit-identical.

    The comparison is an integer maximum, exact in any order, so every rank gets the same verdict
    under any MPI. What it checks is not promised by MPI: that a floating-point all-reduce hands
    every rank the same bits (the standard's advice to implementors under MPI_Reduce asks only for
    the same result from the same arguments in the same order). MPICH's and Open MPI's algorithms
    (recursive doubling with commutative pairwise sums, reduce-scatter then all-gather, ring) do;
    the MPI tests run the trainer with this check under both at odd and even world sizes."""
    c = checksum(model.parameters())
    extremes = torch.tensor([c, -c], dtype=torch.int64)
    comm.allreduce(extremes, "max")  # (largest checksum, -smallest)
    if extremes[0] == -extremes[1]:
        return
    everyone = comm.allgather_obj(c)  # only on the way out: name the ranks
    odd = [r for r, v in enumerate(everyone) if v != everyone[0]]
    raise ReplicasDiverged(
        f"replicas diverged by step {step}: the parameters of {ranks_text(odd)} differ from rank 0's "
        "(bitwise checksum); every rank must apply the same update to the same parameters"
    )


def _short(value: str, limit: int = 60) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."
