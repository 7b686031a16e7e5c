"""Splitting a communicator, without processes: MPI's rule for who goes where, and every wrapper of
the library carried over to each part with its settings.

The wrappers are found in the source, not listed by hand: a new one that is not built below fails
:func:`test_every_wrapper_in_the_library_is_checked`, and one whose parts lose a setting, or come
back unwrapped, fails :func:`test_a_part_is_wrapped_like_its_parent`. That the check catches both is
shown on two wrappers written wrong on purpose."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.comm.gpu import HostBuffers
from mpi_sgd.comm.split import check_split_type, split_table
from mpi_sgd.comm.wrappers.callcheck import CallCheck
from mpi_sgd.comm.wrappers.checked import CheckedComm
from mpi_sgd.comm.wrappers.compress import CompressedComm
from mpi_sgd.comm.wrappers.counting import CountingComm
from mpi_sgd.comm.wrappers.faults import Fault, FaultComm
from mpi_sgd.comm.wrappers.staged import DeviceStagedComm, StagedComm
from mpi_sgd.comm.wrappers.stallreport import stall_report
from mpi_sgd.comm.wrappers.watchdog import Watchdog
from mpi_sgd.comm.wrappers.wrapper import CommWrapper
from mpi_sgd.figures.ring import RecordingComm
from mpi_sgd.paramserver.faults import ExitAfter

PACKAGE = Path(__file__).resolve().parents[2] / "mpi_sgd"


# -- who goes where ---------------------------------------------------------------------------------
def test_ranks_of_a_color_are_ordered_by_key_then_rank():
    # MPI_Comm_split's rule, written out: color 5 holds ranks 0, 2, 4 with keys 1, 0, 1 -> 2, then 0
    # and 4 (equal keys: the lower rank first); color 0 holds 1 and 5 by keys -3 and -4 -> 5, 1.
    entries = [(5, 1), (0, -3), (5, 0), (None, 9), (5, 1), (0, -4)]
    assert split_table(entries) == {0: [5, 1], 5: [2, 0, 4]}
    assert list(split_table(entries)) == [0, 5]  # colors in order: every rank makes the parts alike
    assert split_table([(None, 0)] * 3) == {}
    assert split_table([(np.int64(2), np.int32(1)), (2, 0)]) == {2: [1, 0]}  # numpy integers pass


@pytest.mark.parametrize(
    "entries, named",
    [
        ([(0, 0), (-1, 1)], "rank 1 passed color -1"),
        ([(0.0, 0), (0, 1)], "rank 0 passed color 0.0"),
        ([(True, 0)], "rank 0 passed color True"),
        ([(0, 0), (0, "a")], "rank 1 passed color 0, key 'a'"),
    ],
)
def test_a_bad_color_or_key_is_named_on_every_rank(entries, named):
    with pytest.raises(ValueError, match=f"whole number >= 0 .*{named}"):
        split_table(entries)


def test_split_type_needs_one_known_kind():
    check_split_type([("node", 0), ("node", 3)])
    with pytest.raises(ValueError, match=r"one of \('node',\).*rank 1: 'socket'"):
        check_split_type([("node", 0), ("socket", 1)])
    with pytest.raises(ValueError, match="whole-number keys"):
        check_split_type([("node", 0.5)])


def test_the_size_one_backend_splits_into_itself_or_nothing():
    world = LocalComm()
    part = world.split(3, key=-1)
    assert isinstance(part, LocalComm) and part is not world and (part.rank, part.size) == (0, 1)
    assert world.split(None) is None
    assert isinstance(world.split_type("node"), LocalComm)
    with pytest.raises(ValueError, match="rank 0 passed color -2"):
        world.split(-2)
    with pytest.raises(ValueError, match="split_type"):
        world.split_type("numa")


# -- every wrapper, carried over --------------------------------------------------------------------
class Part(LocalComm):
    """What :class:`Splitting` hands back: remembers the split that made it."""

    def __init__(self, made_by: tuple):
        super().__init__()
        self.made_by = made_by


class Splitting(LocalComm):
    """A world of one whose parts say how they were made, so a test can tell the wrapper split it."""

    def split(self, color, key=None):
        super().split(color, key)
        return None if color is None else Part(("split", color, key))

    def split_type(self, kind="node", key=None):
        super().split_type(kind, key)
        return Part(("split_type", kind, key))


def _report(text: str) -> None:  # a report function that is not the default
    pass


# Every wrapper of the library, built with settings that differ from its defaults.
BUILD = {
    "CommWrapper": lambda inner: CommWrapper(inner),
    "CheckedComm": lambda inner: CheckedComm(inner),
    "CountingComm": lambda inner: CountingComm(inner),
    "CompressedComm": lambda inner: CompressedComm(inner=inner, dtype=torch.bfloat16),  # by keyword too
    "StagedComm": lambda inner: StagedComm(inner, HostBuffers(pin=False)),
    "DeviceStagedComm": lambda inner: DeviceStagedComm(inner, torch.device("cpu")),
    "Watchdog": lambda inner: Watchdog(inner, timeout=7.0, abort_after=9.0, poll=0.25, report=_report),
    "FaultComm": lambda inner: FaultComm(inner, Fault.parse("0:3:nan")),
    "ExitAfter": lambda inner: ExitAfter(inner, 5, code=3),
    "RecordingComm": lambda inner: RecordingComm(inner),  # no settings: its part starts with nothing sent
    "CallCheck": lambda inner: CallCheck(inner),  # no settings: its part checks its own calls from the first
}
# Attributes that a part does not share with its parent by design: each part starts afresh.
# phase_t: when the watchdog last heard where(), a clock reading; owns_inner: a part's wrapper made
# its part (and closes it), whatever its parent was given.
OWN = {"inner", "_built_with", "phase_t", "owns_inner"}


def wrappers_in_the_library() -> set[str]:
    """Every class in mpi_sgd/ that derives from CommWrapper, directly or not, read from the source."""
    classes = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                classes[node.name] = bases
    found, grew = {"CommWrapper"}, True
    while grew:
        more = {name for name, bases in classes.items() if bases & found} - found
        found |= more
        grew = bool(more)
    return found


def check_part(wrapped, color=4, key=-2) -> None:
    """``wrapped``'s parts: its own class, around the inner communicator's part, with its settings."""
    for part, made_by in (
        (wrapped.split(color, key), ("split", color, key)),
        (wrapped.split_type(), ("split_type", "node", None)),
    ):
        layers = []
        a, b = wrapped, part
        while isinstance(a, CommWrapper):
            assert type(b) is type(a), f"{type(a).__name__}'s part is a {type(b).__name__}"
            mine, theirs = vars(a), vars(b)
            differ = sorted(k for k in mine.keys() | theirs.keys() if k not in OWN and mine.get(k) != theirs.get(k))
            assert not differ, f"{type(a).__name__}'s part has other settings: {differ}"
            assert b.owns_inner, f"{type(a).__name__}'s part would not close the part it wraps"
            layers.append(type(a).__name__)
            a, b = a.inner, b.inner
        assert isinstance(b, Part) and b.made_by == made_by, f"{layers} did not wrap the inner part"
    assert wrapped.split(None) is None


def test_every_wrapper_in_the_library_is_checked():
    found = wrappers_in_the_library()
    assert {"CommWrapper", "Watchdog", "FaultComm", "ExitAfter", "DeviceStagedComm"} <= found  # the scan sees them
    missing = sorted(found - set(BUILD))
    assert not missing, f"build {missing} in BUILD (with settings other than its defaults) so its parts are checked"


@pytest.mark.parametrize("name", sorted(BUILD))
def test_a_part_is_wrapped_like_its_parent(name):
    wrapped = BUILD[name](Splitting())
    try:
        check_part(wrapped)
        check_part(CheckedComm(BUILD[name](CountingComm(Splitting()))))  # stacked: every layer carried
    finally:
        if isinstance(wrapped, Watchdog):
            wrapped.close()


def test_the_check_catches_a_wrapper_that_forgets():
    class Forgetful(CommWrapper):  # builds its parts with the default setting
        def __init__(self, inner, level: int = 0):
            super().__init__(inner)
            self.level = level

        def _rewrap(self, inner):
            return Forgetful(inner)

    class Unwrapping(CommWrapper):  # hands back the bare part
        def split(self, color, key=None):
            return self.inner.split(color, key)

    with pytest.raises(AssertionError, match=r"other settings: \['level'\]"):
        check_part(Forgetful(Splitting(), level=2))
    with pytest.raises(AssertionError, match="Unwrapping's part is a Part"):
        check_part(Unwrapping(Splitting()))
    check_part(CommWrapper(Splitting()))  # and passes what is right


def test_one_fault_per_process_whichever_part_it_strikes_through():
    # The fault names job rank 0; the part numbers this process 0 too, but the fault must follow
    # the process, so it is the part's job_rank that counts, and the parent hears of it.
    world = FaultComm(Splitting(), Fault.parse("0:2:nan"), job_rank=0)
    part = world.split(1)
    assert part.job_rank == 0 and part.shot is world.shot
    part.where("forward", 2)
    assert world.shot.fired and world.shot.armed == "nan"
    x = torch.ones(3)
    world.allreduce(x)  # armed by the part, spoils the parent's next all-reduce: one per process
    assert x.isnan().all() and world.tampered == part.tampered and "by NaN" in world.tampered
    other = FaultComm(Splitting(), Fault.parse("1:2:raise"), job_rank=0).split(0)  # another process's fault
    other.where("forward", 2)
    assert not other.shot.fired


def test_exit_after_counts_the_process_sends():
    drill = ExitAfter(Splitting(), 3)
    part = drill.split(0)
    drill.send(torch.ones(1), 0)
    part.send(torch.ones(1), 0)
    assert drill.left == part.left == [1]  # one more send, on either, and the process exits


def test_a_parts_stall_report_names_job_ranks():
    # Part rank 1 is job rank 3, and part rank 0 (job rank 2) waits for it.
    me = {"rank": 0, "host": "h", "pid": 7, "seq": 2, "blocked": [2, "allreduce (call #2)", 3.1], "stack": "s"}
    them = {"rank": 1, "host": "h", "pid": 8, "seq": 1, "blocked": None, "phase": "forward", "phase_age": 3.0}
    text = stall_report(me, {1: them}, 3.0, world_ranks=[2, 3])
    assert text.startswith("mpi_sgd watchdog: allreduce (call #2) has waited 3.1 s on rank 0 (job rank 2) (h)")
    assert ": rank 1 (job rank 3) missing (--stall-timeout 3 s)" in text
    assert "  rank 1 (job rank 3) on h last seen in forward, 3.0 s ago" in text
    # the job's own communicator: numbers as they always were
    assert ": rank 1 missing (--stall-timeout 3 s)" in stall_report(me, {1: them}, 3.0, world_ranks=[0, 1])
