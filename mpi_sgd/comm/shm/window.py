"""Memory shared by the ranks of one node: MPI-3 shared windows handed out as torch tensors.

Ranks on one host can read and write each other's memory directly. MPI-3 makes that portable:
``Split_type(COMM_TYPE_SHARED)`` groups the ranks that can share memory (a *node*), and
``Win.Allocate_shared`` on that group gives every rank a segment that every other rank of the group
maps as well (``Shared_query(q)`` is rank q's). :class:`NodeMemory` hands out such segments as
ordinary torch tensors (numpy views of the window), keeps views of every rank's segment for the
shared all-reduce (:mod:`.allreduce`) and finds the window a tensor lives in.

A window is freed (collectively) once no tensor on any rank uses it: each rank notes the windows
whose tensors it dropped, and at the next :meth:`NodeMemory.alloc`, which every rank calls anyway,
the ranks agree on the ones all of them dropped and free those.

**Nothing is left in /dev/shm.** MPICH maps each window from a file in /dev/shm that it unlinks as
soon as every rank has mapped it, so that memory goes away with the last process, killed or not.
MPICH's own start-up segment (``mpich_shm_*``, its shared-memory transport) keeps its name until
``MPI_Finalize``, so a killed job leaves it behind; once every rank of the node has it mapped,
:func:`unlink_mpi_segments` removes the name (the mapping stays; MPICH tolerates it at finalize).

For tests on one host, ``node_size=k`` (or ``MPI_SGD_SHM_NODE_SIZE=k``) splits each real node into
pretend nodes of k consecutive ranks, so the multi-node (hierarchical) path runs without a cluster.
"""

from __future__ import annotations

import bisect
import operator
import os
import weakref

import numpy as np
import torch
from mpi4py import MPI

from ..base import CollectiveMismatchError, CommError
from .settings import node_size_override


def _mpi_named_segments() -> set[str]:
    """MPICH start-up segments this process maps that still have a name in /dev/shm."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.rstrip("\n").split(None, 5)[-1] for line in f}
    except OSError:
        return set()
    return {p for p in paths if p.startswith("/dev/shm/mpich_shm_") and not p.endswith(" (deleted)")}


def unlink_mpi_segments(node: MPI.Comm) -> None:
    """Unlink MPICH's start-up segment once every rank of ``node`` (a real shared-memory node) maps it.

    The memory stays mapped and working; only the name goes, so a killed job leaves nothing behind.
    Collective over ``node``. Only files that every rank already maps are touched.
    """
    everyone = node.allgather(_mpi_named_segments())
    if node.Get_rank() == 0:
        for path in sorted(set.intersection(*everyone)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def storage_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a window of torch ``dtype`` is made of: its own, or uint16 for bfloat16,
    which numpy lacks (the tensor handed out is a bfloat16 view of it)."""
    if dtype == torch.bfloat16:
        return np.dtype(np.uint16)
    return torch.empty(0, dtype=dtype).numpy().dtype


def _info() -> MPI.Info:
    info = MPI.Info.Create()
    # Each rank's segment starts on its own page: no false sharing between neighbours' ends.
    info.Set("alloc_shared_noncontig", "true")
    return info


def shared_window(node: MPI.Comm, count: int, dtype) -> tuple[MPI.Win, list[np.ndarray]]:
    """A window of ``count`` elements per rank on ``node``: the window and every rank's segment as numpy."""
    dtype = np.dtype(dtype)
    win = MPI.Win.Allocate_shared(max(count, 1) * dtype.itemsize, dtype.itemsize, _info(), comm=node)
    win.Lock_all(MPI.MODE_NOCHECK)  # the passive-target epoch in which Win_sync is allowed
    return win, [segment(win, q, dtype, count) for q in range(node.Get_size())]


def segment(win: MPI.Win, rank: int, dtype, count: int) -> np.ndarray:
    mem, _ = win.Shared_query(rank)
    return np.frombuffer(mem, dtype=dtype, count=count)


PAGE = 4096  # bytes; where pages are larger, reading every 4 KiB still reaches each one


def _map_pages(views: list[np.ndarray]) -> None:
    """Map the other ranks' segments into this process now, by reading a byte of every page.

    A process maps a shared page into its own page table on its first touch (a minor fault; Linux
    maps some 16 pages per fault). Left to the all-reduce, whose every call reads and writes the
    other ranks' slices, each new buffer's first calls would pay those faults, and a benchmark
    walking fresh buffers would pay them on every call (about one per 64 KiB call measured).
    """
    for v in views:
        raw = v.reshape(-1).view(np.uint8)
        if raw.size:
            int(raw[::PAGE].sum())


def free_window(win: MPI.Win) -> None:
    win.Unlock_all()
    win.Free()


class _Segment:
    """One window: every node rank's segment as a numpy view, and where this rank's lives."""

    __slots__ = ("id", "win", "views", "start", "nbytes", "n", "dtype", "torch_dtype", "half", "operands")

    def __init__(self, wid: int, win: MPI.Win, views: list[np.ndarray], rank: int, torch_dtype):
        self.id, self.win, self.views, self.torch_dtype = wid, win, views, torch_dtype
        self.start, self.n, self.dtype = views[rank].ctypes.data, views[rank].size, views[rank].dtype
        self.nbytes = views[rank].nbytes
        self.half = torch_dtype if torch_dtype in (torch.float16, torch.bfloat16) else None  # summed in float32
        self.operands: dict = {}  # the all-reduce's: target rank -> (its view, the others' in rank order)


class NodeMemory:
    """The node split of ``comm`` and the shared windows on it. Collective over ``comm``.

    ``node`` groups the ranks of ``comm`` that share memory; ``leaders`` (multi-node jobs only, on
    node rank 0) joins node rank 0 of every node; ``world_ranks[q]`` is node rank q's rank in ``comm``.
    """

    def __init__(self, comm: MPI.Comm, node_size: int | None = None):
        node_size = node_size_override(node_size)
        real = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        self.host_ranks = real.Get_size()
        unlink_mpi_segments(real)
        self.node = real if node_size is None else real.Split(real.Get_rank() // node_size, real.Get_rank())
        if self.node is not real:
            real.Free()
        self.rank, self.size = self.node.Get_rank(), self.node.Get_size()
        self.comm = comm
        self.world_ranks = self.node.allgather(comm.Get_rank())
        self.multi_node = self.size < comm.Get_size()  # the same answer on every rank
        self.leaders: MPI.Comm | None = None
        self.other_leaders: list[int] = []  # their ranks in comm: whom a leader waits for between nodes
        if self.multi_node:
            leaders = comm.Split(0 if self.rank == 0 else MPI.UNDEFINED, comm.Get_rank())
            if self.rank == 0:
                self.leaders = leaders
                self.other_leaders = [r for r in leaders.allgather(comm.Get_rank()) if r != comm.Get_rank()]
        self._segments: dict[int, _Segment] = {}
        self._starts: list[int] = []  # sorted segment start addresses, for find()
        self._by_start: list[_Segment] = []
        self._found: dict[tuple, tuple | None] = {}  # (address, count, dtype) -> find()'s answer
        self._next_id = 0
        self._dead_ids: set[int] = set()  # segments no tensor on this rank uses any more

    def alloc(self, n: int, dtype=None) -> torch.Tensor:
        """A zeroed tensor of ``n`` elements in a new window. Collective over comm, same n and dtype."""
        dtype = torch.float32 if dtype is None else dtype
        try:
            np_dtype = storage_dtype(dtype)
        except (TypeError, RuntimeError):
            raise CommError(f"dtype {dtype} has no numpy equivalent; shared buffers need one") from None
        try:
            n = operator.index(n)  # numpy integers too
        except TypeError:
            pass  # judged below, on every rank
        # Exchanged over all of comm before judging, so that a bad or mismatched call fails on every
        # rank alike (nodes with buffers of different sizes would hand their leaders' MPI all-reduce
        # different lengths). Windows are freed by the ids every rank dropped: the same on every node.
        everyone = self.comm.allgather((n, str(dtype).replace("torch.", ""), sorted(self._dead_ids)))
        lines = "\n".join(f"  rank {r}: n={e[0]!r}, dtype={e[1]}" for r, e in enumerate(everyone))
        if any(type(e[0]) is not int or e[0] < 0 for e in everyone):
            raise CommError(f"alloc_shared needs a whole number of elements, 0 or more:\n{lines}")
        if any(e[:2] != everyone[0][:2] for e in everyone):
            raise CollectiveMismatchError(f"ranks called alloc_shared with different sizes or dtypes:\n{lines}")
        # Free the windows no rank uses any more: every rank frees the same ones, in the same order.
        for wid in sorted(set.intersection(*(set(e[2]) for e in everyone))):
            self._free(wid)
        win, views = shared_window(self.node, n, np_dtype)
        seg = _Segment(self._next_id, win, views, self.rank, dtype)
        self._next_id += 1
        self._segments[seg.id] = seg
        i = bisect.bisect(self._starts, seg.start)
        self._starts.insert(i, seg.start)
        self._by_start.insert(i, seg)
        # An address remembered as "not ours" may be this window's now (freed memory mapped again),
        # and every rank must send a buffer down the same path.
        self._found.clear()
        mine = segment(win, self.rank, np_dtype, n)  # the caller's own view: when it dies, so may the window
        mine.fill(0)  # zeroed, and every page touched now rather than inside the first all-reduce
        # No barrier needed: a page read before its owner zeroes it is the same page (one per offset
        # of the window's file), so only the mapping is made here, and the alloc stays as cheap.
        _map_pages(views[: self.rank] + views[self.rank + 1 :])
        weakref.finalize(mine, self._dead_ids.add, seg.id)
        return torch.from_numpy(mine).view(dtype)  # bfloat16: the uint16 storage seen as what it holds

    def _free(self, wid: int) -> None:
        seg = self._segments.pop(wid)
        self._found.clear()
        i = self._by_start.index(seg)
        del self._starts[i], self._by_start[i]
        self._dead_ids.discard(wid)
        seg.views.clear()
        seg.operands.clear()
        free_window(seg.win)

    def find(self, buf) -> tuple[_Segment, int, int] | None:
        """(segment, first element, count) if ``buf`` is a contiguous run of one of our windows."""
        kind = type(buf)
        if kind is torch.Tensor:
            if buf.requires_grad or not buf.is_cpu or not buf.is_contiguous():
                return None
            key = (buf.data_ptr(), buf.numel(), buf.dtype)
        elif kind is np.ndarray and buf.flags.c_contiguous:
            # mpi4py's buffer view reads the address several times faster than __array_interface__
            key = (MPI.buffer(buf).address, buf.size, buf.dtype)
        else:
            return None
        return self.find_key(key)

    def find_key(self, key: tuple) -> tuple[_Segment, int, int] | None:
        """:meth:`find` for a buffer already described as (address, element count, dtype)."""
        found = self._found.get(key, False)
        if found is False:
            if len(self._found) > 4096:  # a benchmark walking through many slices
                self._found.clear()
            found = self._found[key] = self._lookup(*key)
        return found

    def _lookup(self, addr: int, n: int, dtype) -> tuple[_Segment, int, int] | None:
        i = bisect.bisect(self._starts, addr) - 1
        if i < 0:
            return None
        seg = self._by_start[i]
        offset, rest = divmod(addr - seg.start, seg.dtype.itemsize)
        if rest or offset + n > seg.n or dtype != (seg.dtype if isinstance(dtype, np.dtype) else seg.torch_dtype):
            return None
        if isinstance(dtype, np.dtype) and seg.torch_dtype == torch.bfloat16:
            return None  # its numpy view holds raw uint16 bits, not numbers to add
        return seg, offset, n

    def close(self) -> None:
        """Free every window (collective; no tensor from :meth:`alloc` may be used afterwards)."""
        for wid in sorted(self._segments):
            self._free(wid)
        if self.leaders is not None:
            self.leaders.Free()
        self.node.Free()
