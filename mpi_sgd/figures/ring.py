"""The ring all-reduce, step by step, as :func:`mpi_sgd.collectives.ring_allreduce` runs it.

Not a drawing of the algorithm but a record of one run of it: every rank all-reduces a buffer of
``p`` chunks through a :class:`RecordingComm`, which notes each message the ring sends. The data
say what each message carries. Chunk ``c`` of rank ``r`` starts as ``(1 + K·c)·2^r`` with
``K = 2^p``; a sum over a set ``S`` of ranks is then ``(1 + K·c)·mask(S)``, where
``mask(S) = Σ 2^s < K``, so any value read off the wire names its chunk (``v // K // mask``) and
whose contributions it already holds (``v % K``). Integers, so the sums are exact.

    mpiexec -n 4 python -m mpi_sgd.figures.ring --out ring.json

:func:`draw` lays the record out as a grid per step (ranks by chunks): reduce-scatter first,
where each arriving chunk is added to the receiver's own, then all-gather, where it replaces it
(Patarasuk & Yuan, JPDC 69(2), 2009). It replays those two rules from the start and checks every
recorded message and the final buffers against the replay, so a record that does not match what
the ring really did is refused, not drawn.
"""

from __future__ import annotations

import sys

import numpy as np

from ..comm.wrappers.wrapper import CommWrapper
from ..report import new_figure

MAX_RANKS = 16  # values up to (2^p - 1)(1 + 2^p (p - 1)) stay exact in int64 well past this
PHASES = ("reduce-scatter", "all-gather")


def encode(rank: int, size: int, per_chunk: int = 2) -> np.ndarray:
    """This rank's buffer: ``per_chunk`` elements of ``(1 + K·c)·2^rank`` for each chunk ``c``."""
    k = 1 << size
    return np.repeat([(1 + k * c) << rank for c in range(size)], per_chunk).astype(np.int64)


def decode(values: np.ndarray, size: int) -> tuple[int, list[int]]:
    """(chunk, contributing ranks) of a message or chunk; all its elements must agree."""
    v = int(values[0]) if values.size else 0
    if v <= 0 or not (values == v).all():
        raise ValueError(f"not one chunk of the ring record: {values!r}")
    k = 1 << size
    mask = v % k
    return v // k // mask, [r for r in range(size) if mask >> r & 1]


class RecordingComm(CommWrapper):
    """``inner``, noting every point-to-point send as (destination, tag, chunk, holders)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.sent: list[dict] = []

    def send(self, buf, dest, tag=0):
        chunk, holds = decode(np.asarray(buf), self.size)
        self.sent.append({"dest": dest, "tag": tag, "chunk": chunk, "holds": holds})
        return self.inner.send(buf, dest, tag)


def record(comm) -> dict | None:
    """All-reduce :func:`encode`'s buffer with the ring on ``comm``; the record on the root."""
    from ..collectives import ring_allreduce

    if comm.size > MAX_RANKS:
        raise ValueError(f"the ring record encodes up to {MAX_RANKS} ranks, not {comm.size}")
    recorder = RecordingComm(comm)
    data = encode(comm.rank, comm.size)
    ring_allreduce(recorder, data)
    chunks = np.split(data, comm.size)
    mine = {"sent": recorder.sent, "result": [decode(c, comm.size)[1] for c in chunks]}
    everyone = comm.gather_obj(mine)
    if not comm.is_root:
        return None
    p = comm.size
    steps = []
    for i in range(2 * (p - 1)):  # the ring's i-th message from every rank is its step i
        phase, step = PHASES[i // (p - 1)], i % (p - 1)
        sends = [{"rank": r, **everyone[r]["sent"][i]} for r in range(p)]
        steps.append({"phase": phase, "step": step, "sends": sends})
    return {"ranks": p, "steps": steps, "result": [e["result"] for e in everyone]}


def replay(rec: dict) -> list[list[list[frozenset]]]:
    """The holders of every chunk on every rank after each step (index 0: before the first).

    Raises ValueError where a recorded message or final buffer differs from the replay.
    """
    p = rec["ranks"]
    state = [[frozenset({r}) for _ in range(p)] for r in range(p)]
    states = [state]
    for s in rec["steps"]:
        new = [row[:] for row in state]
        for m in s["sends"]:
            holds = frozenset(m["holds"])
            if holds != state[m["rank"]][m["chunk"]]:
                raise ValueError(
                    f"{s['phase']} step {s['step'] + 1}: rank {m['rank']} sent chunk {m['chunk']} holding "
                    f"{sorted(holds)}, but it held {sorted(state[m['rank']][m['chunk']])}"
                )
            here = new[m["dest"]][m["chunk"]]
            new[m["dest"]][m["chunk"]] = here | holds if s["phase"] == "reduce-scatter" else holds
        state = new
        states.append(state)
    final = [[sorted(c) for c in row] for row in state]
    if final != [[sorted(c) for c in row] for row in rec["result"]]:
        raise ValueError(f"the ring's final buffers {rec['result']} are not the replay's {final}")
    return states


def _label(holders: frozenset, p: int) -> str:
    return "Σ" if len(holders) == p else "+".join(map(str, sorted(holders)))


def _grid(ax, state, p: int, cmap, received=(), arrows=(), title="") -> None:
    from matplotlib.patches import FancyArrowPatch, Rectangle

    for r in range(p):
        for c in range(p):
            share = len(state[r][c]) / p
            fresh = (r, c) in received
            ax.add_patch(
                Rectangle(
                    (c, r),
                    1,
                    1,
                    facecolor=cmap(0.15 + 0.8 * share),
                    edgecolor="tab:red" if fresh else "white",
                    lw=2.5 if fresh else 1,
                    zorder=2 if fresh else 1,
                )
            )
            full = share == 1
            ax.text(
                c + 0.5,
                r + 0.5,
                _label(state[r][c], p),
                ha="center",
                va="center",
                fontsize=8 if p <= 4 else 6,
                color="white" if share > 0.6 else "black",
                weight="bold" if full else "normal",
            )
    # rank src sends chunk c to rank dst: one row down; the wrap from the last rank to rank 0 leaves
    # the grid at the bottom and comes back in at the top, as round a cylinder.
    right = 0.84  # of the cell, clear of its text
    for src, dst, c in arrows:
        legs = [(src + 0.5, dst + 0.5)] if dst > src else [(src + 0.5, p + 0.4), (-0.4, dst + 0.5)]
        for y0, y1 in legs:
            ax.add_patch(
                FancyArrowPatch(
                    (c + right, y0),
                    (c + right, y1),
                    connectionstyle="arc3,rad=-0.5" if dst > src else "arc3,rad=0",
                    arrowstyle="-|>",
                    mutation_scale=9,
                    color="tab:red",
                    lw=1.2,
                    zorder=3,
                    clip_on=False,
                )
            )
    ax.set_xlim(0, p)
    ax.set_ylim(p + 0.45, -0.45)  # room for the wrap-around arrow's two legs
    ax.set_aspect("equal")
    ax.set_xticks([c + 0.5 for c in range(p)], [f"chunk {c}" for c in range(p)], fontsize=7)
    ax.set_yticks([r + 0.5 for r in range(p)], [f"rank {r}" for r in range(p)], fontsize=7)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, fontsize=9)


def draw(rec: dict):
    """The record as grids: the start and each reduce-scatter step on top, the all-gather below."""
    import matplotlib

    states = replay(rec)
    p = rec["ranks"]
    cmap = matplotlib.colormaps["Blues"]
    cols = p  # start + (p-1) reduce-scatter steps; then (p-1) all-gather steps and the key
    fig, axes = new_figure(2, cols, figsize=(2.6 * cols, 5.8), squeeze=False)
    panels = [axes[0][i] for i in range(cols)] + [axes[1][i] for i in range(cols - 1)]
    _grid(panels[0], states[0], p, cmap, title="start: each rank its own data")
    for i, s in enumerate(rec["steps"]):
        sends = s["sends"]
        _grid(
            panels[i + 1],
            states[i + 1],
            p,
            cmap,
            received={(m["dest"], m["chunk"]) for m in sends},
            arrows=[(m["rank"], m["dest"], m["chunk"]) for m in sends],
            title=f"{s['phase']} step {s['step'] + 1}",
        )
    key = axes[1][cols - 1]
    key.axis("off")
    key.text(
        0,
        0.5,
        f"p = {p} ranks, the buffer cut into {p} chunks.\n"
        "A cell lists whose data the chunk holds\n(Σ: everyone's).\n\n"
        "Arrow: this step's send, rank r to r+1.\nRed edge: arrived in this step.\n\n"
        "Reduce-scatter adds what arrives;\nall-gather replaces the chunk with it.\n\n"
        f"Each rank sends 2(p-1) = {2 * (p - 1)} chunks of n/p:\n2(p-1)/p·n in all, the least any\n"
        "all-reduce can send (Patarasuk & Yuan).",
        fontsize=8,
        va="center",
        transform=key.transAxes,
    )
    fig.suptitle(f"ring all-reduce over {p} ranks, as mpi_sgd.collectives.ring_allreduce ran it", fontsize=11)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    from ..args import ArgumentParser
    from ..comm import init
    from ..launch import placement
    from ..report import write_json

    parser = ArgumentParser(prog="python -m mpi_sgd.figures.ring", description=__doc__)
    parser.add_argument("--out", required=True, help="JSON file for the record (written by rank 0)")
    args = parser.parse_args(argv)
    if placement().size > MAX_RANKS:
        parser.fail(f"the ring record encodes up to {MAX_RANKS} ranks, not {placement().size}")
    rec = record(init())
    if rec is not None:
        write_json(args.out, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
