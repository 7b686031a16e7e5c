"""Timelines as Chrome traces: what ``--timeline`` writes, viewable in ui.perfetto.dev or chrome://tracing.

Each rank records its own events as ``(name, start, seconds)`` or ``(name, start, seconds, args)``
with ``start`` read from ``time.perf_counter()``; :func:`chrome_trace` gathers them on the root as
complete events (``"ph": "X"``), one lane (``tid``) per rank, ``ts``/``dur`` in microseconds
since ``t0``, the instant the ranks left a common barrier (each rank passes its own reading).
"""

from __future__ import annotations


def chrome_trace(comm, events, t0: float) -> dict | None:
    """Every rank's ``events`` as one Chrome trace on the root; ``None`` on the other ranks."""
    mine = [(e[0], e[1] - t0, e[2], e[3] if len(e) > 3 else None) for e in events]
    everyone = comm.gather_obj(mine)
    if not comm.is_root:
        return None
    trace = []
    for rank, evs in enumerate(everyone):
        for name, start, seconds, args in evs:
            event = {"name": name, "ph": "X", "pid": 0, "tid": rank, "ts": 1e6 * start, "dur": 1e6 * seconds}
            if args:
                event["args"] = args
            trace.append(event)
    return {"traceEvents": trace, "displayTimeUnit": "ms"}
