"""bench ddp's split of a DDP step, from steps made up here: no processes, no timing."""

from __future__ import annotations

import math

import pytest

from mpi_sgd.bench.ddp import PARTS, split, timeline


def local(f=1.0, b=2.0, o=0.5):
    return ((0.0, f, f + b, f + b + o), None)


def ddp_step(t0, f, starts, done, bwd_end, o, settled=None):
    """One DDP step starting at t0: forward f seconds, works started at ``starts`` (offsets into
    backward), MPI done at ``done``, backward over at ``bwd_end``, the update ``o``."""
    t1 = t0 + f
    notes = []
    for i, (s, d) in enumerate(zip(starts, done, strict=True)):
        notes += [(i, "start", t1 + s), (i, "waiter", t1 + s + 0.01), (i, "mpi-done", t1 + d)]
        notes.append((i, "settled", t1 + (settled[i] if settled else d + 0.05)))
    return ((t0, t1, t1 + bwd_end, t1 + bwd_end + o), notes)


def test_each_part_is_its_stretch_of_the_step_over_local():
    loc = [local() for _ in range(3)]
    # forward 1.2 (0.2 over), last bucket starts 2.3 s into backward (0.3 over local's 2.0),
    # MPI done at 3.0 (0.7 after it), backward over at 3.4 (0.4 after MPI), update 0.6 (0.1 over)
    rec = [ddp_step(10.0 * i, 1.2, [1.0, 2.3], [2.8, 3.0], 3.4, 0.6) for i in range(3)]
    p = split(rec, loc)
    assert p["forward"] == pytest.approx(0.2)
    assert p["to_last_bucket"] == pytest.approx(0.3)
    assert p["after_last_start"] == pytest.approx(0.7)
    assert p["after_mpi"] == pytest.approx(0.4)
    assert p["optimizer"] == pytest.approx(0.1)
    assert p["buckets"] == 2
    # the parts add up to the step's excess over local (exactly, with one kind of step)
    excess = sum(p[k] for k, _ in PARTS)
    assert p["step"] - p["local_step"] == pytest.approx(excess)


def test_works_outside_backward_are_not_buckets():
    loc = [local()]
    (times, notes) = ddp_step(0.0, 1.0, [0.5], [1.5], 2.0, 0.5)
    notes += [(9, "start", 0.5), (9, "mpi-done", 0.6), (9, "settled", 0.7)]  # in forward: a broadcast, say
    p = split([(times, notes)], loc)
    assert p["buckets"] == 1 and p["after_last_start"] == pytest.approx(1.0)


def test_no_buckets_leaves_the_communication_parts_unknown():
    p = split([((0.0, 1.0, 3.0, 3.5), [])], [local()])
    assert p["buckets"] == 0 and math.isnan(p["after_last_start"]) and p["forward"] == pytest.approx(0.0)


def test_the_timeline_has_the_phases_and_each_bucket():
    rec = [ddp_step(5.0, 1.0, [0.5, 1.5], [1.8, 2.0], 2.2, 0.4)]
    events, t0 = timeline(rec)
    assert t0 == 5.0
    names = [e[0] for e in events]
    assert names[:3] == ["forward", "backward", "optimizer"]
    assert "bucket 1: all-reduce (MPI)" in names and "bucket 0: settling" in names
    mpi = dict((e[0], e) for e in events)["bucket 1: all-reduce (MPI)"]
    assert mpi[1] == pytest.approx(7.5) and mpi[2] == pytest.approx(0.5)


def test_a_late_note_of_the_step_before_does_not_shift_the_bucket_names():
    times, notes = ddp_step(5.0, 1.0, [0.5], [1.8], 2.2, 0.4)
    events, _ = timeline([(times, [(99, "settled", 5.0)] + notes)])  # the previous step's last work
    assert "bucket 0: all-reduce (MPI)" in [e[0] for e in events]
