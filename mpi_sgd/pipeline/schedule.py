"""Pipeline schedules: the order in which each stage runs its forwards and backwards.

A step cuts the batch into ``m`` micro-batches. Stage ``s`` of ``R`` runs ``F(i)``, the forward
of micro-batch ``i`` (after receiving its input from stage ``s-1``), and ``B(i)``, its backward
(after receiving the gradient of its output from stage ``s+1``). A schedule is the order of
those ``2m`` ops on each stage; the data they exchange is implied by it.

* **GPipe** (Huang et al., 2019): every forward, then every backward, newest first.
* **1F1B** (PipeDream-Flush; Narayanan et al., 2021): a warm-up of ``min(R-s-1, m)``
  forwards, then one forward and one backward in turn, then a cool-down of the remaining
  backwards.

One slot per op (forward and backward taking the same time), R = 3, m = 4, as
:func:`simulate` lays them out::

      GPipe   stage 0: F0 F1 F2 F3 .  .  .  .  B3 B2 B1 B0
              stage 1: .  F0 F1 F2 F3 .  .  B3 B2 B1 B0 .
              stage 2: .  .  F0 F1 F2 F3 B3 B2 B1 B0 .  .
      1F1B    stage 0: F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
              stage 1: .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .
              stage 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .

Under GPipe each stage holds the activations of all ``m`` micro-batches at once; under 1F1B
stage ``s`` never holds more than ``min(R-s, m)``, and the bubble is the same.

With every op of one stage taking the same time and messages free, both leave each stage idle
for ``R-1`` op-slots of each kind out of ``m+R-1``: the bubble fraction ``(R-1)/(m+R-1)``
(GPipe, section 2.2). :func:`simulate` runs a schedule on that idealised machine; it also shows
why the runtime sends without blocking (see :mod:`mpi_sgd.pipeline.stage`).
"""

from __future__ import annotations

from typing import NamedTuple


class Op(NamedTuple):
    kind: str  # "F" or "B"
    mb: int  # micro-batch index

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}"


def gpipe(stage: int, stages: int, m: int) -> list[Op]:
    return [Op("F", i) for i in range(m)] + [Op("B", i) for i in reversed(range(m))]


def one_f_one_b(stage: int, stages: int, m: int) -> list[Op]:
    warmup = min(stages - stage - 1, m)
    ops = [Op("F", i) for i in range(warmup)]
    for i in range(m - warmup):  # steady state: the forward that fills a slot, the backward that frees one
        ops += [Op("F", warmup + i), Op("B", i)]
    return ops + [Op("B", i) for i in range(m - warmup, m)]


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def schedule(name: str, stage: int, stages: int, m: int) -> list[Op]:
    """The op order of ``stage`` (of ``stages``) under schedule ``name`` for ``m`` micro-batches."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if not 0 <= stage < stages or m < 1:
        raise ValueError(f"need 0 <= stage < stages and m >= 1, got stage {stage}, stages {stages}, m {m}")
    return SCHEDULES[name](stage, stages, m)


def peak_in_flight(ops: list[Op]) -> int:
    """Most micro-batches whose forward has run and backward has not: what activation memory holds."""
    live = peak = 0
    for op in ops:
        live += 1 if op.kind == "F" else -1
        peak = max(peak, live)
    return peak


class Deadlock(RuntimeError):
    """No stage can make progress and some have ops left."""


def _program(ops: list[Op], stage: int, stages: int) -> list[tuple]:
    """The op list with its messages: ("recv"|"send", peer, key) around ("run", op)."""
    prog = []
    for op in ops:
        if op.kind == "F":
            if stage > 0:
                prog.append(("recv", stage - 1, ("act", op.mb)))
            prog.append(("run", op))
            if stage < stages - 1:
                prog.append(("send", stage + 1, ("act", op.mb)))
        else:
            if stage < stages - 1:
                prog.append(("recv", stage + 1, ("grad", op.mb)))
            prog.append(("run", op))
            if stage > 0:
                prog.append(("send", stage - 1, ("grad", op.mb)))
    return prog


def simulate(name: str, stages: int, m: int, t_f=1.0, t_b=2.0, blocking_sends: bool = False):
    """Run schedule ``name`` on an ideal machine; per stage, ``[(op, start, end)]``.

    Ops take ``t_f``/``t_b`` (one number, or one per stage), messages take no time. Receives
    block until the message exists. Sends complete at once (``isend``) or, with
    ``blocking_sends``, only when the receiver has reached the matching receive, as ``MPI_Send``
    may for any message too big to buffer. Raises :class:`Deadlock`, naming what each stage
    waits for, if the stages get stuck.
    """
    t_f = [t_f] * stages if isinstance(t_f, (int, float)) else list(t_f)
    t_b = [t_b] * stages if isinstance(t_b, (int, float)) else list(t_b)
    progs = [_program(schedule(name, s, stages, m), s, stages) for s in range(stages)]
    pc, clock = [0] * stages, [0.0] * stages
    mailbox: dict[tuple, float] = {}  # (src, dst, key) -> time the message became available
    done: list[list] = [[] for _ in range(stages)]
    while any(pc[s] < len(progs[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            while pc[s] < len(progs[s]):
                what, *rest = progs[s][pc[s]]
                if what == "run":
                    (op,) = rest
                    start = clock[s]
                    clock[s] += t_f[s] if op.kind == "F" else t_b[s]
                    done[s].append((op, start, clock[s]))
                elif what == "send":
                    peer, key = rest
                    if blocking_sends:
                        if pc[peer] >= len(progs[peer]) or progs[peer][pc[peer]] != ("recv", s, key):
                            break  # rendezvous: the receiver has not posted the matching receive
                        clock[s] = clock[peer] = max(clock[s], clock[peer])
                        pc[peer] += 1
                    else:
                        mailbox[(s, peer, key)] = clock[s]
                else:  # recv
                    peer, key = rest
                    if (peer, s, key) not in mailbox:
                        break
                    clock[s] = max(clock[s], mailbox.pop((peer, s, key)))
                pc[s] += 1
                moved = True
        if not moved:
            waits = "; ".join(f"stage {s} at {progs[s][pc[s]]}" for s in range(stages) if pc[s] < len(progs[s]))
            raise Deadlock(f"{name} with R={stages}, m={m} cannot proceed: {waits}")
    return done


def bubble(timeline: list[list]) -> float:
    """Idle fraction of the stages between the first op's start and the last op's end."""
    start = min(t[1] for ops in timeline for t in ops)
    end = max(t[2] for ops in timeline for t in ops)
    busy = sum(t[2] - t[1] for ops in timeline for t in ops)
    return 1.0 - busy / (len(timeline) * (end - start))


def ideal_bubble(stages: int, m: int) -> float:
    """``(R-1)/(m+R-1)``: GPipe's bubble fraction with equal stages and free messages."""
    return (stages - 1) / (m + stages - 1)
