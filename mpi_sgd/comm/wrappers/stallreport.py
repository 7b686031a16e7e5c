"""The watchdog's messages, as pure functions of what each rank said about itself.

A *status* is the small dict every rank's watchdog keeps (see
:meth:`mpi_sgd.comm.wrappers.watchdog.Watchdog.status`): ``rank``, ``host``, ``pid``, ``step`` (None
outside a training loop), ``phase`` and ``phase_age`` (what the rank last said it was doing, and
how long ago), ``seq`` (collectives it has started), ``blocked`` (``[seq, label, seconds]`` of the
call it is waiting in, or None), ``calls`` (its last collectives as ``[seq, label, signature]``),
``stack`` (its Python stacks as text) and ``left`` (True once it has exited). A rank that did not
answer is None. Nothing here communicates, so every message is tested without processes.
"""

from __future__ import annotations


def call_label(name: str, step: int | None, index: int, seq: int) -> str:
    """'iallreduce[2] of step 20 (call #61)': the index counts this step's collectives from 0."""
    if step is None:
        return f"{name} (call #{seq})"
    return f"{name}[{index}] of step {step} (call #{seq})"


def where(status: dict) -> str:
    """'forward of step 20, 5.1 s ago' / 'waiting in broadcast (call #3) for 5.0 s'."""
    if status.get("blocked"):
        _, label, age = status["blocked"]
        return f"waiting in {label} for {age:.1f} s"
    step = "" if status.get("step") is None else f" of step {status['step']}"
    if status.get("left"):
        return f"{status.get('phase') or 'start-up'}{step}"
    return f"{status.get('phase') or 'start-up'}{step}, {status.get('phase_age', 0.0):.1f} s ago"


def rank_labels(world_ranks: list[int] | None):
    """How a message names rank r: ``3`` in the job's own communicator, ``1 (job rank 3)`` in a part
    of it, where the part's numbers alone would send a reader to the wrong process."""
    if world_ranks is None or world_ranks == list(range(len(world_ranks))):
        return str
    return lambda r: f"{r} (job rank {world_ranks[r]})"


def _call(status: dict, seq: int) -> list | None:
    return next((c for c in status.get("calls", ()) if c[0] == seq), None)


def stall_report(me: dict, others: dict[int, dict | None], timeout: float, world_ranks: list[int] | None = None) -> str:
    """What the rank ``me``, stalled in a call for ``timeout`` seconds or more, prints.

    ``others`` maps every other rank to its status (None: it did not answer). A rank is *missing*
    when it has not started the call ``me`` waits in (fewer collectives started), has left the job,
    or does not answer; a rank that made that call as a different collective or with different
    arguments is named with both versions, since that is the deadlock (or the garbage) to fix.
    ``world_ranks`` (a part of a split communicator): each rank's rank in the job, named beside its own.
    """
    name = rank_labels(world_ranks)
    seq, label, age = me["blocked"]
    missing, notes, mismatched = [], [], []
    for rank in sorted(others):
        s = others[rank]
        if s is None:
            missing.append(rank)
            notes.append(f"rank {name(rank)} did not answer: killed, or stuck outside Python")
        elif s.get("left"):
            missing.append(rank)
            notes.append(f"rank {name(rank)} has left the job: it exited during {where(s)}")
        elif seq is None or s["seq"] < seq:  # None: a point-to-point call; say where everyone is
            if seq is not None:
                missing.append(rank)
            notes.append(f"rank {name(rank)} on {s['host']} last seen in {where(s)}")
        else:
            theirs, mine = _call(s, seq), _call(me, seq)
            if theirs and mine and theirs[2] != mine[2]:
                mismatched.append(rank)
                notes.append(
                    f"rank {name(rank)} made call #{seq} as {theirs[2]}, where rank {name(me['rank'])} made {mine[2]}"
                )
    head = f"mpi_sgd watchdog: {label} has waited {age:.1f} s on rank {name(me['rank'])} ({me['host']})"
    if missing:
        head += f": rank{'s' if len(missing) > 1 else ''} {', '.join(map(name, missing))} missing"
    if mismatched:
        head += f"; rank{'s' if len(mismatched) > 1 else ''} {', '.join(map(name, mismatched))} made a different call"
    if not missing and not mismatched and seq is not None:
        head += "; every rank has started this call (a slow network, or a peer stuck inside MPI)"
    lines = [head + f" (--stall-timeout {timeout:g} s)", *(f"  {n}" for n in notes)]
    lines.append("Python stacks of every rank that answered:")
    for rank, s in sorted({me["rank"]: me, **others}.items()):
        if s is not None and s.get("stack"):
            lines.append(f"--- rank {name(rank)} on {s['host']} (pid {s['pid']}), {where(s)}")
            lines.append(s["stack"].rstrip())
    return "\n".join(lines)


def mismatch_report(seq: int, calls: dict[int, list], world_ranks: list[int] | None = None) -> str:
    """Ranks whose collective number ``seq`` differed: ``calls`` maps rank -> [seq, label, signature]."""
    name = rank_labels(world_ranks)
    lines = [f"mpi_sgd watchdog: ranks made different collective calls at call #{seq}:"]
    lines += [f"  rank {name(rank)}: {c[2]}, its {c[1]}" for rank, c in sorted(calls.items())]
    return "\n".join(lines)
