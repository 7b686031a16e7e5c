"""All-reduce sweep: the seam against raw mpi4py, the hand-written ring and torch.distributed.

For each power-of-two message size it times, interleaved in one run (see :mod:`.timing`):

* ``raw``  ``MPI.Comm.Allreduce(IN_PLACE, ndarray)``: the floor any Python wrapper stands on;
* ``seam`` ``comm.allreduce(tensor)`` on a torch tensor from :func:`mpi_sgd.comm.buffers.zeros`,
  as the trainer's gradient buffers are (``seam-torchalloc``: on torch's own allocator, which
  gets no huge pages; see that function for why that costs time on large messages);
* ``seam-checked`` the same through the per-call argument check that jobs run with
  (:mod:`mpi_sgd.comm.wrappers.callcheck`): its cost is the ``check cost`` column;
* ``ring`` :func:`mpi_sgd.collectives.ring_allreduce`, the teaching ring over send/recv;
* ``gloo`` ``torch.distributed.all_reduce`` with gloo (``nccl`` on GPUs), timed apart (:func:`~mpi_sgd.timing.passes`).

Times come in one table, what they say in a second: ``raw/seam time`` (raw time over seam time:
1.0 = the seam costs nothing, 0.8 = it takes 25% longer) beside ``seam-raw us`` (the seam's time
minus raw's, which noise can make negative). Bandwidths follow nccl-tests: algbw = bytes / time,
busbw = algbw * 2(p-1)/p, the fraction of the link an optimal all-reduce must use, so busbw is
comparable across world sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..args import UsageError, add_command, choices_list, flag, nonneg_int, positive_int
from ..args import nbytes as byte_size
from ..collectives import ring_allreduce
from ..comm import TORCH_BACKENDS, Communicator
from ..comm.buffers import zeros
from ..confidence import median_interval, target_line
from ..report import Output, human_bytes, markdown_table, plot_by_size, save_results
from ..timing import osu_iterations, passes, time_interleaved

IMPLS = ("raw", "seam", "seam-checked", "seam-torchalloc", "ring", *TORCH_BACKENDS)


@dataclass(frozen=True)
class Flags(Output):
    min_bytes: int = flag(4, "smallest message", byte_size)
    max_bytes: int = flag(64 << 20, "largest message", byte_size)
    impls: list = flag(
        ["raw", "seam", "seam-checked", "ring", "gloo"],
        f"comma-separated implementations to time: {','.join(IMPLS)}",
        choices_list(IMPLS, "implementation"),
    )
    iterations: int | None = flag(
        None, "timed iterations per size (default: OSU's 1000 up to 8 KiB, 100 above)", positive_int
    )
    warmup: int | None = flag(None, "discarded iterations per size (default: OSU's 100/10)", nonneg_int)
    rounds: int = flag(
        8,
        "interleaved blocks per implementation, the order rotating each round; each rank reports its median block",
        positive_int,
    )
    detail: bool = flag(False, "also print min/avg/max and algbw/busbw per implementation")

    def __post_init__(self):
        if self.min_bytes > self.max_bytes:
            raise ValueError(f"--min-bytes ({self.min_bytes}) is larger than --max-bytes ({self.max_bytes})")


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from ``min_bytes`` to ``max_bytes`` inclusive (rounded up to a power of two)."""
    out, n = [], 1 << max(0, math.ceil(math.log2(min_bytes)))
    while n <= max_bytes:
        out.append(n)
        n *= 2
    return out


def bus_factor(p: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(p-1)/p: 0 for a single rank, where nothing moves."""
    return 2 * (p - 1) / p


def _calls(comm, peers: dict[str, Communicator], impls, nbytes: int, checked=None):
    """One zero-filled float32 buffer per implementation (zeros keep sums finite forever; ``seam``
    and ``seam-checked`` share one), and its call: ``{name: (call, buffer)}``."""
    from mpi4py import MPI

    n = max(1, nbytes // 4)
    calls = {}
    seamed = zeros(n) if {"seam", "seam-checked"} & set(impls) else None
    for name in impls:
        if name == "raw":
            arr, mpi = np.zeros(n, np.float32), comm.comm
            calls[name] = (lambda arr=arr, mpi=mpi: mpi.Allreduce(MPI.IN_PLACE, arr)), arr
        elif name == "seam":
            calls[name] = (lambda t=seamed: comm.allreduce(t)), seamed
        elif name == "seam-checked":
            # The seam's own buffer where both are timed: the check's cost is then the difference
            # between two calls on one buffer. On two, where each lay (pages, cache sets) moved the
            # ratio from 1 MiB by one or two percent from run to run, as much as the 1% target.
            calls[name] = (lambda t=seamed: checked.allreduce(t)), seamed
        elif name == "seam-torchalloc":  # the same, on memory from torch's own allocator
            t = torch.zeros(n)
            calls[name] = (lambda t=t: comm.allreduce(t)), t
        elif name == "ring":
            t, scratch = zeros(n), np.empty(n // comm.size + 1, np.float32)
            calls[name] = (lambda t=t, s=scratch: ring_allreduce(comm, t, scratch=s)), t
        else:  # a torch.distributed backend
            peer = peers[name]
            t = zeros(n, device=peer.device)
            calls[name] = (lambda t=t, peer=peer: peer.allreduce(t)), t
    return calls


def wrong_results(comm, call, buf) -> int:
    """nccl-tests' ``#wrong``: elements of one all-reduce of known values that differ from the exact
    sum, counted over every rank. Rank r contributes ``i % 7 + r`` at element i: small integers, so
    every order of additions gives the exact sum ``R (i % 7) + R (R - 1) / 2`` in float32."""
    n = buf.shape[0]
    i = np.arange(n) % 7
    mine, want = (i + comm.rank).astype(np.float32), (comm.size * i + comm.size * (comm.size - 1) / 2)
    if isinstance(buf, np.ndarray):
        buf[:] = mine
    else:
        buf.copy_(torch.from_numpy(mine))
    call()
    got = buf if isinstance(buf, np.ndarray) else buf.cpu().numpy()
    wrong = int((got != want.astype(np.float32)).sum())
    buf[:] = 0  # back to zeros for the next size's timing
    return sum(comm.allgather_obj(wrong))


def run(
    comm, impls=("raw", "seam", "ring", "gloo"), min_bytes=4, max_bytes=64 << 20, iterations=None, warmup=None, rounds=5
):
    """Sweep the sizes; returns one dict per (size, impl) with seconds and bandwidths."""
    from ..comm.backends.torch_dist import TorchDistComm
    from ..comm.wrappers.callcheck import CallCheck

    comm = comm.inner if isinstance(comm, CallCheck) else comm  # seam: the backend alone
    checked = CallCheck(comm) if "seam-checked" in impls else None
    peers = {name: TorchDistComm(name, comm) for name in impls if name in TORCH_BACKENDS}
    sync = torch.cuda.synchronize if "nccl" in peers else None
    stats, wrong = {}, {}
    for together in passes(impls, apart=peers):
        for nbytes in sizes(min_bytes, max_bytes):
            osu_iters, osu_warm = osu_iterations(nbytes)
            made = _calls(comm, peers, together, nbytes, checked)
            calls = {name: call for name, (call, _) in made.items()}
            warm = osu_warm if warmup is None else warmup
            timed = time_interleaved(comm, calls, iterations or osu_iters, warm, rounds, sync)
            for name, (call, buf) in made.items():
                stats[nbytes, name], wrong[nbytes, name] = timed[name], wrong_results(comm, call, buf)
    rows = []
    for nbytes in sizes(min_bytes, max_bytes):
        for name in impls:
            st = stats[nbytes, name]
            algbw = nbytes / st.avg
            rows.append(
                dict(bytes=nbytes, impl=name, ranks=comm.size, min_s=st.min, avg_s=st.avg, max_s=st.max)
                | dict(algbw_GBps=algbw / 1e9, busbw_GBps=algbw * bus_factor(comm.size) / 1e9)
                | dict(blocks=list(st.blocks), wrong=wrong[nbytes, name])
            )
    return rows


def summary_table(rows, impls) -> str:
    """Microseconds per call of each implementation (the median block, averaged over ranks), one
    column each, so that nine implementations still fit a 120-column terminal."""
    by = {(r["bytes"], r["impl"]): r for r in rows}
    body = [[human_bytes(b)] + [by[b, i]["avg_s"] * 1e6 for i in impls] for b in sorted({r["bytes"] for r in rows})]
    return markdown_table(["size"] + list(impls), body)


def derived_table(rows, impls) -> str:
    """What the times say, per size: the seam against raw, the check's cost, bus bandwidth, wrong results."""
    by = {(r["bytes"], r["impl"]): r for r in rows}
    seam_raw = "raw" in impls and "seam" in impls
    checked = "seam-checked" in impls and "seam" in impls
    base = "raw" if "raw" in impls else impls[0]
    headers = ["size"]
    headers += ["raw/seam time", "seam-raw us"] if seam_raw else []
    headers += ["check cost %"] if checked else []
    headers += [f"busbw GB/s ({base})", "#wrong"]  # nccl-tests': elements that differ from the exact sum, all impls
    out = []
    for nbytes in sorted({r["bytes"] for r in rows}):
        t = {i: by[nbytes, i]["avg_s"] for i in impls}
        row = [human_bytes(nbytes)]
        if seam_raw:
            row += [f"{t['raw'] / t['seam']:.3f}", (t["seam"] - t["raw"]) * 1e6]
        if checked:
            row.append(f"{(t['seam-checked'] / t['seam'] - 1) * 100:+.1f}")
        row.append(by[nbytes, base]["busbw_GBps"])
        row.append(str(sum(by[nbytes, i].get("wrong", 0) for i in impls)))
        out.append(row)
    return markdown_table(headers, out)


def detail_table(rows, impl) -> str:
    """OSU/nccl-tests style for one implementation: latency min/avg/max across ranks and bandwidths."""
    headers = ["size", "avg us", "min us", "max us", "algbw GB/s", "busbw GB/s"]
    keys = ("avg_s", "min_s", "max_s")
    body = [
        [human_bytes(r["bytes"])] + [r[k] * 1e6 for k in keys] + [r["algbw_GBps"], r["busbw_GBps"]]
        for r in rows
        if r["impl"] == impl
    ]
    return markdown_table(headers, body)


def seam_note(rows, threshold=64 << 10) -> list[str]:
    """The seam against raw mpi4py: its fixed per-call cost (the median of seam - raw below
    ``threshold``), then raw time over seam time block by block with its 95% interval against the
    project's targets, at least 0.8x at 4 KiB and 0.95x at 64 KiB."""
    avg = {(r["bytes"], r["impl"]): r["avg_s"] for r in rows}
    by = {(r["bytes"], r["impl"]): r.get("blocks") or [r["avg_s"]] for r in rows}
    small = [avg[b, "seam"] - avg[b, "raw"] for b, i in avg if i == "raw" and b < threshold]
    lines = []
    if small:
        lines.append(f"seam per-call overhead below {human_bytes(threshold)}: median {np.median(small) * 1e6:.2f} us")
    for size, target in ((4 << 10, 0.8), (64 << 10, 0.95)):
        if (size, "raw") in by and (size, "seam") in by:
            ratio = [r / s for r, s in zip(by[size, "raw"], by[size, "seam"], strict=True)]
            what = f"seam vs raw mpi4py at {human_bytes(size)}, raw/seam time"
            lines.append(target_line(what, median_interval(ratio), target, at_most=False))
    return lines


def check_note(rows) -> list[str]:
    """The per-call argument check's cost against the project's targets, seam-checked over seam block by
    block with its 95% interval: at most 1.05x at 4 KiB, and 1.01x from 1 MiB up (all those sizes'
    blocks pooled)."""
    by = {(r["bytes"], r["impl"]): r.get("blocks") or [r["avg_s"]] for r in rows}
    ratios = {
        b: [c / s for c, s in zip(by[b, "seam-checked"], by[b, "seam"], strict=True)]
        for b, i in by
        if i == "seam" and (b, "seam-checked") in by
    }
    lines = []
    if 4096 in ratios:
        lines.append(target_line("per-call argument check at 4 KiB", median_interval(ratios[4096]), 1.05))
    large = [x for b, r in ratios.items() if b >= 1 << 20 for x in r]
    if large:
        lines.append(target_line("per-call argument check from 1 MiB", median_interval(large), 1.01))
    return lines


def plot(rows, impls, path) -> None:
    series = {}
    for impl in impls:
        mine = [r for r in rows if r["impl"] == impl]
        series[impl] = ([r["bytes"] for r in mine], [r["avg_s"] * 1e6 for r in mine])
    plot_by_size(path, series, "all-reduce time (us)", f"all-reduce, {rows[0]['ranks']} ranks")


def main(comm, args: Flags) -> int:
    impls = tuple(args.impls)
    rows = run(comm, impls, args.min_bytes, args.max_bytes, args.iterations, args.warmup, args.rounds)
    if comm.is_root:
        print(f"# all-reduce sweep: {comm.size} ranks, float32, in place, rounds={args.rounds}")
        print("\nus per call (each rank's median block, averaged over ranks):\n" + summary_table(rows, impls))
        print("\n" + derived_table(rows, impls))
        if "raw" in impls and "seam" in impls:
            print("\n" + "\n".join(seam_note(rows)))
        if "seam" in impls and "seam-checked" in impls:
            print("\n".join(check_note(rows)))
        if args.detail:
            for impl in impls:
                print(f"\n## {impl}\n" + detail_table(rows, impl))
        save_results(
            args,
            f"allreduce-n{comm.size}",
            {"benchmark": "allreduce", "ranks": comm.size, "rows": rows},
            lambda png: plot(rows, impls, png),
        )
    return 0


def _run(args: Flags) -> int:
    from ..comm import init
    from ..comm.backends import backend_available
    from ..comm.wrappers.watchdog import without_watchdog

    missing = [i for i in args.impls if i in TORCH_BACKENDS and not backend_available(i)]
    if missing:  # decided identically on every rank, before any communication
        raise UsageError(f"torch.distributed backend(s) not available in this torch: {', '.join(missing)}")
    # The seam's own cost per call is the question here, not the stall watchdog's (bench sgd times that)
    return main(without_watchdog(init("mpi4py")), args)


def add_parser(kinds) -> None:
    """``mpi-sgd bench allreduce``: register on the ``bench`` command's sub-parsers."""
    add_command(
        kinds,
        "allreduce",
        Flags,
        _run,
        help="all-reduce sweep: seam vs raw mpi4py vs ring vs torch.distributed",
        description="Time all-reduce at power-of-two sizes, OSU style, implementations interleaved: the seam "
        "on torch tensors (seam), raw mpi4py Allreduce on numpy (raw), the ring built from send/recv (ring), "
        "torch.distributed gloo/nccl. Prints raw/seam time, the seam's per-call overhead and "
        "the per-call check's cost; writes JSON and PNG.",
    )
