"""Python's garbage collector, kept from making every rank a straggler in turn.

A full collection walks every object the process tracks, and a process that has imported torch
tracks a great many: its modules, their functions, classes and dicts. Such a collection takes far
longer than a small model's step, and the rank doing it is a straggler: the others wait for it at
the next all-reduce. Each rank reaches its own full collection at a step of its own, so a job of
R ranks waits R times (the figures are on the docs' page Measured: Time to a target).

Freezing the heap when training starts (:func:`gc.freeze`: every object alive then moves to a
generation the collector never walks) leaves the collections only what training itself allocates.
What is alive at the start (modules, the model, the data, the optimizer) is meant to live as long
as training does, and garbage among it is not lost: :func:`gc.unfreeze` hands it all back when
training ends, so a script that goes on is the process it was. torchtitan answers the same
stragglers by turning automatic collection off and collecting on every rank at the same steps.

Used by the trainer, the parameter server's training (a server's collection keeps every worker
waiting) and the benchmarks' interleaved blocks (:func:`mpi_sgd.timing.time_interleaved`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[bool]:
    """Freeze the heap for the ``with`` block; yields whether it did. A process whose collector is
    off or already holds a frozen heap (its owner's choice) is left as it is: unfreezing at the end
    would hand back the owner's objects too."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield False
        return
    gc.freeze()
    try:
        yield True
    finally:
        gc.unfreeze()
