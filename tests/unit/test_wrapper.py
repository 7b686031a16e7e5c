"""Wrapper communicators alone, around the size-1 backend: no MPI, no processes.

CommWrapper must hand every call of the seam to the communicator it wraps, unchanged, so that a
wrapper adding one concern (argument checks, a watchdog, fault injection, byte counting) changes
nothing else; CheckedComm must refuse, before communicating, a call the ranks disagree on."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from mpi_sgd.comm import CollectiveMismatchError, Communicator
from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.comm.wrappers.checked import CheckedComm
from mpi_sgd.comm.wrappers.faults import Fault, FaultComm
from mpi_sgd.comm.wrappers.watchdog import Watchdog
from mpi_sgd.comm.wrappers.wrapper import CommWrapper

SEAM = sorted(
    name for name, member in inspect.getmembers(Communicator) if not name.startswith("_") and callable(member)
)


class Recording(LocalComm):
    """The size-1 backend, noting every seam call it receives and with which arguments."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []
        self.device = "cpu"  # an attribute only this backend has
        self._depth = 0

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if name in SEAM and callable(attr):

            def noted(*args, **kwargs):
                if self._depth == 0:  # calls from outside; not LocalComm's own (send calls isend)
                    self.calls.append((name, *args, *kwargs.values()))
                self._depth += 1
                try:
                    return attr(*args, **kwargs)
                finally:
                    self._depth -= 1

            return noted
        return attr


def test_every_seam_method_is_delegated_explicitly():
    # A method added to Communicator must be added to CommWrapper too; otherwise the base
    # class's version (or an abstract one) would run instead of the wrapped communicator's.
    missing = [name for name in SEAM if name not in vars(CommWrapper)]
    assert not missing, f"CommWrapper does not delegate {missing}"
    for attr in ("rank", "size", "local_rank", "local_size", "backend", "node_shared"):
        assert isinstance(vars(CommWrapper)[attr], property)


def every_call(comm) -> list[tuple]:
    """Each seam call once, with arguments a world of one accepts; returns what it should record."""
    x, slot = torch.arange(3.0), torch.zeros(1, 3)
    comm.send(x, 0, 5)
    assert comm.iprobe(0, 5, None).tag == 5 and comm.probe(0, 5, None).source == 0
    comm.recv(x, 0, 5)
    pending = comm.irecv(x, 0, 6)
    comm.isend(x, 0, 6).wait()
    pending.wait()
    comm.allreduce(x, "max")
    comm.iallreduce(x, "min").wait()
    comm.broadcast(x, 0)
    comm.reduce(x, "sum", 0)
    comm.gather(x, slot, 0)
    comm.allgather(x, slot)
    comm.scatter(slot, x, 0)
    comm.reduce_scatter(x, x, [3], "sum")
    comm.ireduce_scatter(x, x, [3], "avg").wait()
    comm.iallgather(x, slot).wait()
    comm.barrier()
    comm.ibarrier().wait()
    comm.where("forward", 3)
    assert comm.bcast_obj("o", 0) == "o" and comm.allgather_obj(1) == [1] and comm.gather_obj(2, 0) == [2]
    assert comm.wtime() > 0
    assert comm.alloc_shared(4, torch.float64).tolist() == [0.0] * 4 and comm.node_shared is False
    part, node = comm.split(0, 5), comm.split_type("node")
    assert type(part) is type(node) is type(comm) and part.size == node.size == 1  # wrapped alike
    if isinstance(comm, CommWrapper):
        comm.owns_inner = True  # as init() marks its stack: closing the wrapper closes what it wraps
    comm.close()
    with pytest.raises(SystemExit):
        comm.abort(3)
    names = [
        "send",
        "iprobe",
        "probe",
        "recv",
        "irecv",
        "isend",
        "allreduce",
        "iallreduce",
        "broadcast",
        "reduce",
        "gather",
        "allgather",
        "scatter",
        "reduce_scatter",
        "ireduce_scatter",
        "iallgather",
        "barrier",
        "ibarrier",
        "where",
        "bcast_obj",
        "allgather_obj",
        "gather_obj",
        "wtime",
        "alloc_shared",
        "split",
        "split_type",
        "close",
        "abort",
    ]
    assert sorted(names) == SEAM  # the list above covers the whole seam
    return names


# Every wrapper of the library, built so that it adds nothing here (a fault for another rank).
WRAPPERS = {
    "CommWrapper": CommWrapper,
    "Watchdog": lambda inner: Watchdog(inner, timeout=5),
    "FaultComm": lambda inner: FaultComm(inner, Fault.parse("1:1:raise")),
}


class Closing(LocalComm):
    def __init__(self):
        super().__init__()
        self.closed = 0

    def close(self):
        self.closed += 1

    def split(self, color, key=None):
        return None if color is None else Closing()


def test_a_wrapper_closes_what_it_made_and_leaves_what_it_was_given():
    given = Closing()
    around = CommWrapper(given)  # someone else holds `given`
    around.close()
    assert given.closed == 0
    made = CommWrapper(Closing())
    made.owns_inner = True
    made.close()
    made.close()
    assert made.inner.closed == 1  # once, however often it is asked
    part = CommWrapper(given).split(0)  # a part is made for its wrapper alone
    part.close()
    assert part.inner.closed == 1 and given.closed == 0


def test_init_marks_its_whole_stack_as_its_own(monkeypatch):
    from mpi_sgd.comm import init

    monkeypatch.setenv("MPI_SGD_FAULT", "0:99:raise")  # a wrapper around the size-1 backend
    comm = init("local", abort_on_error=False)
    assert isinstance(comm, FaultComm) and comm.owns_inner


@pytest.mark.parametrize("wrap", WRAPPERS.values(), ids=WRAPPERS.keys())
def test_calls_reach_the_inner_communicator_unchanged(wrap):
    inner = Recording()
    wrapped = wrap(inner)
    names = every_call(wrapped)
    assert [c[0] for c in inner.calls] == names
    assert inner.calls[6][2:] == ("max",) and inner.calls[9][2:] == ("sum", 0)  # arguments pass through
    assert (wrapped.rank, wrapped.size, wrapped.local_rank, wrapped.local_size) == (0, 1, 0, 1)
    assert wrapped.backend == "local" and wrapped.is_root
    assert wrapped.device == "cpu"  # a backend's own attribute, looked up on the inner one
    with pytest.raises(AttributeError):
        _ = wrapped.no_such_thing
    assert repr(wrapped) == f"<{type(wrapped).__name__} of <Recording backend=local rank=0/1>>"


def test_a_wrapper_overrides_only_its_concern_and_stacks():
    class CountingComm(CommWrapper):  # the example of the module's docstring
        def __init__(self, inner):
            super().__init__(inner)
            self.bytes = 0

        def allreduce(self, buf, op="sum"):
            self.bytes += buf.numel() * buf.element_size()
            return self.inner.allreduce(buf, op)

    inner = Recording()
    counting = CountingComm(CheckedComm(inner))  # wrappers stack
    x = torch.ones(4, dtype=torch.float64)
    assert counting.allreduce(x) is x
    counting.barrier()
    assert counting.bytes == 32
    # the checked layer asked every rank (here one) before the call it then made
    assert [c[0] for c in inner.calls] == ["allgather_obj", "allreduce", "barrier"]


class TwoRankView(Recording):
    """Looks like rank 0 of two to a wrapper; the other rank always passed something else."""

    def __init__(self):
        super().__init__()
        self.size = 2

    def allgather_obj(self, obj):
        return [obj, ("what rank 1 passed",)]


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.allreduce(torch.zeros(3)),
        lambda c: c.iallreduce(np.zeros(3), "avg"),
        lambda c: c.broadcast(torch.zeros(3), 1),
        lambda c: c.reduce(torch.zeros(3), "max", 1),
        lambda c: c.gather(torch.zeros(3), torch.zeros(2, 3)),
        lambda c: c.allgather(torch.zeros(3), torch.zeros(2, 3)),
        lambda c: c.scatter(torch.zeros(2, 3), torch.zeros(3)),
        lambda c: c.reduce_scatter(torch.zeros(4), torch.zeros(2)),
    ],
    ids=["allreduce", "iallreduce", "broadcast", "reduce", "gather", "allgather", "scatter", "reduce_scatter"],
)
def test_checked_refuses_disagreement_before_communicating(call):
    inner = TwoRankView()
    with pytest.raises(CollectiveMismatchError, match=r"with different arguments.*\n  rank 0: .*\n  rank 1: "):
        call(CheckedComm(inner))
    assert [c[0] for c in inner.calls] == ["allgather_obj"]  # the check; the collective never started


def test_checked_passes_agreeing_calls_through():
    inner = Recording()
    checked = CheckedComm(inner)
    names = every_call(checked)
    checks = [c for c in inner.calls if c[0] == "allgather_obj" and c[1:] != (1,)]  # not every_call's own
    assert len(checks) == 10  # one per collective with arguments to agree on
    assert [c[0] for c in inner.calls if c not in checks] == names
