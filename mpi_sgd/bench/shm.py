"""``bench shm``: the shared-memory all-reduce against MPI's own, the seam, gloo and a memcpy.

For each power-of-two size it times, interleaved in one run (see :mod:`.timing`; gloo apart, after
the others: :func:`~mpi_sgd.timing.passes` says why):

* ``shared`` ``comm.allreduce`` on (a numpy view of) a buffer from ``comm.alloc_shared``
  (:mod:`mpi_sgd.comm.shm.allreduce`);
* ``raw``    ``MPI.Comm.Allreduce(IN_PLACE, ndarray)``: the MPI library's own all-reduce;
* ``seam``   ``comm.allreduce`` on an ordinary torch tensor: what the strategies did before shared buckets;
* ``gloo``   ``torch.distributed.all_reduce`` over gloo;
* ``memcpy`` one process (rank 0) copying the same number of bytes while the others wait: the floor
  an all-reduce that reads and writes every byte once cannot beat.

Every call works on a fresh buffer: each implementation walks through a pool of ``--pool`` bytes
(four times the last-level cache here by default), one slice per call, so a call never finds its
data in cache from the call before, as a gradient bucket would not after a training step. Pools
are written once before timing, so no call pays for first-touch page faults.

Times are each rank's median block, averaged over ranks (``memcpy``: rank 0's). The targets this
benchmark checks are printed under the table, each with its 95% interval and "met", "not met here"
or "inconclusive here" (:mod:`mpi_sgd.confidence`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..args import add_command, choices_list, flag, nbytes, positive_int
from ..comm.buffers import zeros
from ..report import Output, human_bytes, save_results
from ..timing import passes, time_interleaved
from .allreduce import bus_factor, sizes, wrong_results
from .shm_report import derived_table, plot, table, verdicts

IMPLS = ("shared", "raw", "seam", "gloo", "memcpy")


@dataclass(frozen=True)
class Flags(Output):
    min_bytes: int = flag(4 << 10, "smallest message, at least 4 B (one float32)", nbytes)
    max_bytes: int = flag(64 << 20, "largest message", nbytes)
    impls: list = flag(
        list(IMPLS),
        f"comma-separated implementations to time: {','.join(IMPLS)}",
        choices_list(IMPLS, "implementation"),
    )
    pool: int = flag(
        128 << 20,
        "bytes each implementation cycles through so no call finds a warm cache (at least twice --max-bytes is used)",
        nbytes,
    )
    rounds: int = flag(8, "interleaved blocks per implementation, the order rotating each round", positive_int)
    iterations: int | None = flag(
        None,
        "timed calls per size and implementation (default: 1000 up to 8 KiB, 100 above, fewer from 16 MiB)",
        positive_int,
    )

    def __post_init__(self):
        if self.min_bytes > self.max_bytes:
            raise ValueError(f"--min-bytes ({self.min_bytes}) is larger than --max-bytes ({self.max_bytes})")
        if self.min_bytes < 4:
            raise ValueError("--min-bytes must be at least 4 (one float32)")


def iterations(nbytes: int) -> int:
    """OSU's 1000 iterations up to 8 KiB and 100 above, fewer from 16 MiB so a sweep stays minutes."""
    return 1000 if nbytes <= 8192 else max(10, min(100, (1 << 30) // nbytes))


class _Pools:
    """One pool per implementation, each cut into slices of the current size, used in turn."""

    def __init__(self, comm, impls, pool_bytes: int, peer):
        n = pool_bytes // 4
        self.comm, self.peer, self.n, self.impls = comm, peer, n, impls
        self.bufs = {}
        for name in impls:
            if name == "shared":
                self.bufs[name] = comm.alloc_shared(n).numpy()
            elif name == "raw":
                self.bufs[name] = np.zeros(n, np.float32)
            elif name in ("seam", "gloo"):
                self.bufs[name] = zeros(n)
            elif comm.rank == 0:  # memcpy: source and destination, on the copying rank only
                self.bufs[name] = (np.zeros(n, np.float32), np.zeros(n, np.float32))
        for buf in self.bufs.values():
            for part in buf if isinstance(buf, tuple) else (buf,):
                part[:] = 0  # touch every page now

    def calls(self, nbytes: int) -> dict:
        """One function per implementation, each call on the next slice of its pool.

        The slices are cut beforehand, so no call pays for making one (a torch slice costs more
        than a small all-reduce here) and every implementation is timed on its call alone.
        """
        count = nbytes // 4
        slots = self.n // count
        out = {}
        for name in self.impls:  # the same order on every rank: the blocks run in this order
            buf = self.bufs.get(name)
            if buf is None:  # memcpy off rank 0: the other ranks wait at the next block's barrier
                out[name] = lambda: None
                continue
            pools = buf if name == "memcpy" else (buf,)
            out[name] = self._call(name, [[p[i * count : (i + 1) * count] for i in range(slots)] for p in pools])
        return out

    def checked(self, name: str, nbytes: int):
        """``(call, buffer)``: one all-reduce of ``name`` on the first slice of its pool, for
        :func:`~.allreduce.wrong_results` (which leaves the slice zeroed, as timing found it)."""
        return self._call(name, [[self.bufs[name][: nbytes // 4]]]), self.bufs[name][: nbytes // 4]

    def _call(self, name: str, slices: list[list]):
        from mpi4py import MPI

        turn = itertools.cycle(range(len(slices[0])))
        first = slices[0]
        if name in ("shared", "seam"):
            return lambda: self.comm.allreduce(first[next(turn)])
        if name == "raw":
            return lambda: self.comm.comm.Allreduce(MPI.IN_PLACE, first[next(turn)])
        if name == "gloo":
            return lambda: self.peer.allreduce(first[next(turn)])
        dst = slices[1]

        def memcpy():
            i = next(turn)
            np.copyto(dst[i], first[i])

        return memcpy


def run(comm, impls, min_bytes: int, max_bytes: int, pool_bytes: int, rounds: int, iters=None) -> list[dict]:
    peer = None
    if "gloo" in impls:
        from ..comm.backends.torch_dist import TorchDistComm

        peer = TorchDistComm("gloo", comm)
    pools = _Pools(comm, impls, max(pool_bytes, 2 * max_bytes), peer)
    rows = [{"bytes": size, "ranks": comm.size} for size in sizes(min_bytes, max_bytes)]
    for together in passes(impls, apart={"gloo"}):  # 10-100x slower, gloo needs no pairing
        for row in rows:
            calls = pools.calls(row["bytes"])
            n = iters or iterations(row["bytes"])
            stats = time_interleaved(comm, {name: calls[name] for name in together}, n, max(2, n // 10), rounds)
            for name, st in stats.items():
                row[name] = st.max if name == "memcpy" else st.avg  # memcpy: the copying rank's time
                row[f"{name}_blocks"] = list(st.blocks)  # the slowest rank's per block: for the intervals
                if name != "memcpy":  # nccl-tests' columns: bus bandwidth, and results checked once
                    row[f"{name}_busbw_GBps"] = row["bytes"] / st.avg * bus_factor(comm.size) / 1e9
                    row[f"{name}_wrong"] = wrong_results(comm, *pools.checked(name, row["bytes"]))
    return rows


def main(comm, args) -> int:
    from ..comm.shm.allreduce import MIN_BYTES

    impls = tuple(args.impls)
    rows = run(comm, impls, args.min_bytes, args.max_bytes, args.pool, args.rounds, args.iterations)
    if comm.is_root:
        print(
            f"# all-reduce, {comm.size} ranks, float32, in place, fresh buffer each call (pool "
            f"{human_bytes(max(args.pool, 2 * args.max_bytes))} per implementation),\n# median of {args.rounds} "
            "interleaved blocks (gloo timed apart, after the others), avg over ranks (memcpy: rank 0 alone);\n"
            "# shared and seam through the seam without the stall watchdog; times in us"
        )
        print(
            f"# below {human_bytes(MIN_BYTES)} a shared buffer takes MPI's own Allreduce: there shared and "
            "raw differ by the seam's\n# Python dispatch alone"
        )
        print(table(rows, impls) + "\n\n" + derived_table(rows, impls))
        print("\n" + "\n".join(verdicts(rows, comm.size)))
        save_results(
            args,
            f"shm-n{comm.size}",
            {"benchmark": "shm", "ranks": comm.size, "rows": rows},
            lambda png: plot(rows, impls, png),
        )
    return 0


def _run(args: Flags) -> int:
    from ..comm import init
    from ..comm.wrappers.watchdog import without_watchdog

    # The all-reduce's own cost is the question here, not the stall watchdog's (bench sgd times that)
    return main(without_watchdog(init("mpi4py")), args)


def add_parser(kinds) -> None:
    """``mpi-sgd bench shm``: register on the ``bench`` command's sub-parsers."""
    add_command(
        kinds,
        "shm",
        Flags,
        _run,
        help="shared-memory all-reduce vs MPI Allreduce vs the seam vs gloo vs memcpy, fresh buffers",
        description=__doc__,
    )
