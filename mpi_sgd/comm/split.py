"""Who goes where when a communicator is split: the rule of ``MPI_Comm_split``, as plain arithmetic.

:meth:`~mpi_sgd.comm.base.Communicator.split` gathers every rank's ``(color, key)``; every rank then
reads the same table through :func:`split_table`, so a bad argument on one rank fails on all of them
alike instead of leaving the others waiting in a split that one rank never enters. The rule is the
MPI standard's for ``MPI_Comm_split``: ranks of one color form one group, ordered by key and, among
equal keys, by their rank in the communicator being split.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

SPLIT_TYPES = ("node",)  # what split_type() cuts by: the ranks that share memory (MPI_COMM_TYPE_SHARED)


def split_table(entries: Sequence) -> dict[int, list[int]]:
    """Who goes where in a split: ``entries[r]`` is rank r's ``(color, key)``; returns every color's
    ranks in their order in its part, by key and then by rank (``MPI_Comm_split``'s order).

    A color is a whole number, 0 or more, or None (MPI_UNDEFINED: no part for that rank); a key is
    a whole number. Every rank judges the whole table, so every rank raises the same error, naming
    each rank that passed something else.
    """
    bad = [
        f"rank {r} passed color {color!r}, key {key!r}"
        for r, (color, key) in enumerate(entries)
        if not (color is None or _whole(color) and color >= 0) or not _whole(key)
    ]
    if bad:
        raise ValueError(
            "split needs a color that is a whole number >= 0 (or None: no sub-communicator) and a whole-number "
            "key on every rank: " + "; ".join(bad)
        )
    parts: dict[int, list[int]] = {}
    for r, (color, _) in sorted(enumerate(entries), key=lambda e: (e[1][1], e[0])):
        if color is not None:
            parts.setdefault(operator.index(color), []).append(r)
    return dict(sorted(parts.items()))


def check_split_type(entries: Sequence) -> None:
    """Every rank's ``(kind, key)`` for :meth:`Communicator.split_type`: one known kind, whole-number keys."""
    kinds = {kind for kind, _ in entries}
    if len(kinds) != 1 or not kinds <= set(SPLIT_TYPES) or not all(_whole(key) for _, key in entries):
        passed = "; ".join(f"rank {r}: {kind!r}, key {key!r}" for r, (kind, key) in enumerate(entries))
        raise ValueError(
            f"split_type needs the same kind on every rank, one of {SPLIT_TYPES}, and whole-number keys: {passed}"
        )


def _whole(x) -> bool:
    """An int, or what passes for one (a numpy integer); never a bool or a float."""
    if isinstance(x, bool):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True
