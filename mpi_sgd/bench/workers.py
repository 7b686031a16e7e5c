"""[DDP-bench]'s all-reduce table: backend x workers (2, 4, 6) x data size (1 MB .. 1 GB).

    mpi-sgd bench workers                       # mpiexec -n 2, 4, 6 in turn (those the cores hold)
    mpi-sgd bench workers --max-bytes 100MB     # the same without the 1 GB row (small machines)
    mpiexec -n 4 mpi-sgd bench workers          # only this world's column

The table needs one MPI job per worker count, and a job cannot change its own size, so started
as a single process this command launches ``mpiexec -n W`` for each ``--workers`` entry (the
command in ``MPI_SGD_MPIEXEC``, else the ``mpiexec`` beside this Python), waits for each, and
merges the columns they wrote. Started under mpiexec it measures the current world only.

Timing follows [DDP-bench]'s practice: 5 warm-up calls discarded, then 10 timed, with a barrier
before each timed block, and the per-rank figures gathered so the table shows the average with
min and max across ranks. From 100 MB on, where one call takes seconds, it is 1 and 3, as OSU
also lowers its counts for large messages. Sizes are [DDP-bench]'s decimal 1, 10, 100
and 1000 MB of float32. Backends run one after another, never interleaved, so a rank holds one
1 GB buffer at a time. Worker counts above the core count oversubscribe: those columns measure
contention as much as the transport; [DDP-bench]'s own 4- and 6-worker rows came from a laptop.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ..args import add_command, choices_list, flag, nbytes, nonneg_int, positive_int, rank_list
from ..comm import BACKENDS, TORCH_BACKENDS
from ..launch import JobFailed, placement, run_job
from ..report import Output, human_bytes, markdown_table, new_figure, save_results, write_json
from ..timing import WARMUP_STEPS

SIZES = (10**6, 10**7, 10**8, 10**9)
CHOICES = ("mpi4py", *TORCH_BACKENDS)  # the seam's own backend beside torch.distributed's
WORKERS = (2, 4, 6)
LARGE = 10**8


@dataclass(frozen=True)
class Flags(Output):
    workers: list | None = flag(None, "worker counts to launch (default: those of 2,4,6 that fit the cores)", rank_list)
    max_bytes: int = flag(1 << 30, "largest size, at least 1MB", nbytes)
    backends: list = flag(
        ["mpi4py", "gloo", "nccl"],
        "mpi4py (the seam), gloo, nccl (skipped without CUDA)",
        choices_list(CHOICES, "backend"),
    )
    warmup: int = flag(WARMUP_STEPS, "discarded calls per size (1 from 100MB)", nonneg_int)
    iterations: int = flag(10, "timed calls per size (3 from 100MB)", positive_int)

    def __post_init__(self):
        if self.max_bytes < SIZES[0]:
            raise ValueError(f"--max-bytes must be at least 1MB, got {self.max_bytes}")
        if self.workers and min(self.workers) < 2:
            raise ValueError(f"an all-reduce needs --workers of at least 2, got {','.join(map(str, self.workers))}")


def label(n: int) -> str:
    return f"{n // 10**6}MB" if n >= 10**6 else human_bytes(n)


def measure(comm, sizes, backends, warmup=WARMUP_STEPS, iterations=10) -> list[dict]:
    """This world's column: seconds per all-reduce for each backend and size."""
    import torch

    from ..comm.backends.torch_dist import TorchDistComm
    from ..comm.buffers import zeros
    from ..timing import time_interleaved

    rows = []
    for backend in backends:
        peer = comm if backend == "mpi4py" else TorchDistComm(backend, comm)
        device = getattr(peer, "device", "cpu")
        sync = torch.cuda.synchronize if backend == "nccl" else None
        for n in sizes:
            buf = zeros(n // 4, device=device)
            w, it = (min(warmup, 1), min(iterations, 3)) if n >= LARGE else (warmup, iterations)
            call = {backend: lambda b=buf, peer=peer: peer.allreduce(b)}
            st = time_interleaved(comm, call, it, w, min(it, 5), sync)[backend]
            rows.append(dict(backend=backend, workers=comm.size, bytes=n, avg_s=st.avg, min_s=st.min, max_s=st.max))
            del buf
    return rows


def table(rows) -> str:
    headers = ["Backend", "Workers", "Data Size", "Time (s)", "min (s)", "max (s)"]
    rows = sorted(rows, key=lambda r: (BACKENDS.index(r["backend"]), r["workers"], r["bytes"]))
    body = [
        [r["backend"], r["workers"], label(r["bytes"]), f"{r['avg_s']:.6f}", f"{r['min_s']:.6f}", f"{r['max_s']:.6f}"]
        for r in rows
    ]
    return markdown_table(headers, body)


def plot(rows, path) -> None:
    fig, ax = new_figure(figsize=(6, 4))
    for key in sorted({(r["backend"], r["workers"]) for r in rows}):
        pts = sorted((r["bytes"], r["avg_s"]) for r in rows if (r["backend"], r["workers"]) == key)
        ax.loglog(*zip(*pts, strict=True), "o-", label=f"{key[0]}, {key[1]} workers")
    ax.set_xlabel("data size (bytes)")
    ax.set_ylabel("all-reduce time (s)")
    ax.set_title("[DDP-bench] all-reduce table")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _backends(args) -> list[str]:
    from ..comm.backends import backend_available

    out = []
    for b in args.backends:
        if b == "nccl" and not _cuda():
            print("nccl: skipped, CUDA not available")
        elif b != "mpi4py" and not backend_available(b):
            print(f"{b}: skipped, not in this torch build")
        else:
            out.append(b)
    return out


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def column(args) -> int:
    """Under mpiexec: measure this world, the root writes its column."""
    from ..comm import init

    comm = init("mpi4py")
    backends = _backends(args) if comm.is_root else None
    backends = comm.bcast_obj(backends)  # one decision for every rank
    rows = measure(comm, [n for n in SIZES if n <= args.max_bytes], backends, args.warmup, args.iterations)
    if comm.is_root:
        out = write_json(f"{args.out_dir}/workers-n{comm.size}.json", {"benchmark": "workers", "rows": rows})
        print(table(rows) + f"\n\nwrote {out}")
    return 0


def launch(args) -> int:
    """As one process: one mpiexec per worker count, then the merged table, JSON and PNG."""
    passed = [
        "--max-bytes",
        str(args.max_bytes),
        "--backends",
        ",".join(args.backends),
        "--out-dir",
        args.out_dir,
        "--warmup",
        str(args.warmup),
        "--iterations",
        str(args.iterations),
    ]
    rows = []
    for w in args.workers:
        try:
            run_job(w, "-m", "mpi_sgd.cli", "bench", "workers", *passed, echo=True)
        except JobFailed as e:
            print(e, file=sys.stderr)
            return e.returncode
        rows += json.loads(Path(args.out_dir, f"workers-n{w}.json").read_text())["rows"]
    print("\n" + table(rows))
    save_results(args, "workers-allreduce", {"benchmark": "workers", "rows": rows}, lambda png: plot(rows, png))
    return 0


def main(args: Flags) -> int:
    if placement().size > 1:
        return column(args)
    if args.workers is None:
        args = replace(args, workers=default_workers(os.cpu_count() or 1))
        print(
            f"{os.cpu_count()} cores here: starting jobs of {', '.join(map(str, args.workers))} workers "
            f"(pass --workers {','.join(map(str, WORKERS))} for the full table, oversubscribed)"
        )
    args = replace(args, backends=_backends(args))  # say once, here, which backends this machine lacks
    return launch(args)


def default_workers(cores: int) -> list[int]:
    """[DDP-bench]'s 2, 4 and 6 workers, those that fit ``cores`` (2 at least: an all-reduce needs two)."""
    return [w for w in WORKERS if w <= cores] or [WORKERS[0]]


def add_parser(subparsers) -> None:
    add_command(
        subparsers,
        "workers",
        Flags,
        main,
        help="[DDP-bench]'s all-reduce table: backend x workers 2/4/6 x 1MB..1GB",
        description=__doc__,
    )
