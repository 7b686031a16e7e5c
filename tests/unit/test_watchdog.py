"""The watchdog's and fault injection's parts that need no second process: the messages (built from
statuses written out by hand), the spec of MPI_SGD_FAULT, each fault's effect, and the watchdog's
notes on a size-1 communicator. The same messages coming out of real jobs are checked in
tests/mpi/test_watchdog.py and by the fault matrix (tests/integration/test_faults.py)."""

from __future__ import annotations

import time

import pytest
import torch

from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.comm.wrappers.faults import Fault, FaultComm
from mpi_sgd.comm.wrappers.stallreport import mismatch_report, stall_report
from mpi_sgd.comm.wrappers.watchdog import Watchdog
from mpi_sgd.launch import env_seconds


def status(rank, seq, blocked=None, calls=(), step=412, phase="forward", left=False):
    return {
        "rank": rank,
        "host": f"h{rank}",
        "pid": 100 + rank,
        "step": step,
        "phase": phase,
        "phase_age": 3.0,
        "seq": seq,
        "blocked": blocked,
        "calls": [list(c) for c in calls],
        "stack": f"stack of {rank}",
        "left": left,
    }


ME_CALL = (57, "allreduce[3] of step 412 (call #57)", "allreduce((10,) float32 sum)")


def test_the_report_names_missing_ranks_where_they_were_and_every_stack():
    me = status(0, 57, blocked=[57, ME_CALL[1], 61.0], calls=[ME_CALL])
    others = {
        1: status(1, 57, blocked=[57, ME_CALL[1], 60.5], calls=[ME_CALL]),  # arrived
        2: status(2, 56, phase="forward"),  # not there yet
        3: None,  # no answer
        4: status(4, 55, phase="backward", step=411, left=True),
        5: status(
            5,
            57,
            blocked=[57, "broadcast (call #57)", 60.0],
            calls=[(57, "broadcast (call #57)", "broadcast((10,) float32 root 0)")],
        ),
    }
    text = stall_report(me, others, timeout=60)
    head = text.splitlines()[0]
    assert head == (
        "mpi_sgd watchdog: allreduce[3] of step 412 (call #57) has waited 61.0 s on rank 0 (h0): ranks 2, 3, 4 "
        "missing; rank 5 made a different call (--stall-timeout 60 s)"
    )
    assert "  rank 2 on h2 last seen in forward of step 412, 3.0 s ago" in text
    assert "  rank 3 did not answer: killed, or stuck outside Python" in text
    assert "  rank 4 has left the job: it exited during backward of step 411" in text
    assert (
        "  rank 5 made call #57 as broadcast((10,) float32 root 0), where rank 0 made allreduce((10,) float32 sum)"
        in (text)
    )
    assert "rank 1" not in head  # it is there, waiting too
    for r in (0, 1, 2, 5):
        assert f"stack of {r}" in text
    assert "--- rank 0 on h0 (pid 100), waiting in allreduce[3] of step 412 (call #57) for 61.0 s" in text


def test_everyone_arrived_says_so():
    me = status(0, 5, blocked=[5, "barrier (call #5)", 9.0], calls=[(5, "barrier (call #5)", "barrier()")])
    text = stall_report(me, {1: status(1, 5, calls=[(5, "barrier (call #5)", "barrier()")])}, timeout=5)
    assert "every rank has started this call" in text.splitlines()[0]


def test_a_mismatch_shows_both_calls():
    label = "iallreduce[0] of step 3 (call #9)"
    text = mismatch_report(
        9, {0: [9, label, "iallreduce((8,) float32 sum)"], 1: [9, label, "iallreduce((7,) float32 sum)"]}
    )
    assert text.splitlines() == [
        "mpi_sgd watchdog: ranks made different collective calls at call #9:",
        "  rank 0: iallreduce((8,) float32 sum), its iallreduce[0] of step 3 (call #9)",
        "  rank 1: iallreduce((7,) float32 sum), its iallreduce[0] of step 3 (call #9)",
    ]


def test_the_watchdog_notes_calls_and_steps_on_one_rank():
    wd = Watchdog(LocalComm(), timeout=5)
    assert wd.monitor is None  # one rank waits for nobody
    wd.allreduce(torch.ones(3))
    wd.where("forward", 4)
    req = wd.iallreduce(torch.ones(2, 5), "avg")
    wd.broadcast(torch.ones(1, dtype=torch.float64), root=0)
    req.wait()
    assert [tuple(c[1:]) for c in wd.history()] == [
        ("allreduce (call #1)", "allreduce((3,) float32 sum)"),
        ("iallreduce[0] of step 4 (call #2)", "iallreduce((2, 5) float32 avg)"),
        ("broadcast[1] of step 4 (call #3)", "broadcast((1,) float64 root 0)"),
    ]
    s = wd.status()
    assert (s["step"], s["phase"], s["seq"], s["blocked"]) == (4, "forward", 3, None)
    assert "in test_the_watchdog_notes_calls_and_steps_on_one_rank" in s["stack"]


@pytest.mark.parametrize(
    "text, why",
    [("1:20", "rank:step:kind"), ("a:1:raise", "rank:step:kind"), ("0:3:melt", "not one of"), ("0:0:raise", "from 1")],
)
def test_bad_fault_specs_say_what_is_wrong(text, why):
    with pytest.raises(ValueError, match=why):
        Fault.parse(text)


def test_faults_fire_on_their_rank_at_their_step_only():
    fc = FaultComm(LocalComm(), Fault.parse("0:3:raise"))
    fc.where("batch", 2)
    fc.where("forward")
    with pytest.raises(RuntimeError, match="MPI_SGD_FAULT=0:3:raise"):
        fc.where("batch", 3) or fc.where("forward")
    fc.where("forward")  # once only
    other = FaultComm(LocalComm(), Fault.parse("1:3:raise"))  # rank 1 does not exist here
    other.where("forward", 3)


def test_nan_and_shape_change_the_steps_next_allreduce():
    fc = FaultComm(LocalComm(), Fault.parse("0:1:nan"))
    fc.where("forward", 1)
    buf = torch.ones(4)
    fc.iallreduce(buf).wait()
    assert buf.isnan().all()
    fc.allreduce(buf.fill_(1.0))
    assert buf.tolist() == [1.0] * 4  # once only

    seen = []

    class Spy(LocalComm):
        def allreduce(self, buf, op="sum"):
            seen.append(tuple(buf.shape))
            return buf

    fc = FaultComm(Spy(), Fault.parse("0:1:shape"))
    fc.where("forward", 1)
    fc.allreduce(torch.ones(4))
    fc.allreduce(torch.ones(4))
    assert seen == [(3,), (4,)]


def test_stall_timeout_from_the_environment():
    assert env_seconds("T", 60.0, {}) == 60.0
    assert env_seconds("T", 60.0, {"T": "2.5"}) == 2.5
    for bad in ("soon", "-1", "inf"):
        with pytest.raises(ValueError, match="T must be"):
            env_seconds("T", 60.0, {"T": bad})


def test_the_fault_matrix_judges_status_message_and_time():
    from mpi_sgd.faultmatrix import CASES, judge

    stall = next(c for c in CASES if c.fault and c.fault.endswith("stall"))
    report = (
        "mpi_sgd watchdog: wait() of iallreduce[0] of step 3 (call #9) has waited 3.2 s on rank 0 (h): rank 1 missing"
    )
    fault = "mpi_sgd fault: rank 1, step 3: stall (MPI_SGD_FAULT=1:3:stall) at 1000.0\n"
    ok = judge(stall, 1, fault + report, start=990.0, end=1005.0, stall_timeout=3)
    assert ok.passed and ok.seconds == 5.0 and ok.bound == 13.0 and ok.message == report[len("mpi_sgd ") :]
    # each way of not ending as it should fails the case
    assert not judge(stall, 1, fault + report, 990.0, 1013.5, 3).passed  # too slow after the fault
    assert not judge(stall, 0, fault + report, 990.0, 1005.0, 3).passed  # exit status 0
    assert not judge(stall, 1, fault + "something else", 990.0, 1005.0, 3).passed  # no such message
    assert not judge(stall, 1, report, 990.0, 1005.0, 3).passed  # the fault never happened
    bad_arg = next(c for c in CASES if c.status == "2")
    line = "sync_sgd.py: error: --lr must be positive, got -1.0\n"
    assert not judge(bad_arg, 1, line, 0.0, 5.0, 3).passed  # status 1, not 2
    assert judge(bad_arg, 2, line, 0.0, 5.0, 3).passed
    # a refusal is one line from the root: not one per rank, not after a traceback
    assert judge(bad_arg, 2, line * 2, 0.0, 5.0, 3).message.startswith("printed 2 times: ")
    assert not judge(bad_arg, 2, line * 2, 0.0, 5.0, 3).passed
    assert not judge(bad_arg, 2, "Traceback (most recent call last):\n" + line, 0.0, 5.0, 3).passed
    # a message that does not name the faulty rank fails the case too
    vague = report.replace("rank 1 missing", "a rank is missing")
    assert not judge(stall, 1, fault + vague, 990.0, 1005.0, 3).passed


HYDRA = """processes: rank 0 = pid 4100 on a, rank 1 = pid 4242 on b
mpi_sgd fault: rank 1, step 3: kill (MPI_SGD_FAULT=1:3:kill) at 1000.0
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 4242 RUNNING AT b
=   EXIT CODE: 9
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
"""


def test_a_killed_rank_is_named_from_the_launchers_pid_and_the_start_line():
    from mpi_sgd.faultmatrix import CASES, judge
    from mpi_sgd.launchers import explain_death, processes_line

    assert processes_line(["4100@a", "4242@b"]) == HYDRA.splitlines()[0]  # what the trainer prints at start
    assert explain_death(HYDRA) == "rank 1 (pid 4242 on b) killed by signal 9"
    assert explain_death(HYDRA.replace("PID 4242", "PID 4100")) == "rank 0 (pid 4100 on b) killed by signal 9"
    exited = HYDRA.replace("EXIT CODE: 9", "EXIT CODE: 3").replace("Killed (signal 9)", "exit(3)")
    assert explain_death(exited) == "rank 1 (pid 4242 on b) exited with status 3"
    assert explain_death(HYDRA.split("\n", 1)[1]) is None  # no start line: no rank to name
    assert explain_death(HYDRA.replace("PID 4242", "PID 7")) is None  # a PID of no rank
    # Open MPI's launcher names the rank itself, its sentence wrapped at 72 columns
    ompi = "prterun noticed that process rank 1 with PID 4242 on node b exited on\nsignal 9 (Killed).\n"
    assert explain_death(ompi) == "rank 1 (pid 4242 on b) killed by signal 9"
    kill = next(c for c in CASES if c.fault and c.fault.endswith("kill"))
    outcome = judge(kill, 9, HYDRA, 990.0, 1000.5, 3)
    assert outcome.passed and outcome.message == "rank 1 (pid 4242 on b) killed by signal 9"
    assert not judge(kill, 9, HYDRA.split("\n", 1)[1], 990.0, 1000.5, 3).passed  # the PID alone names no rank


@pytest.mark.parametrize("abort_after, expected", [(None, 5.0), (0, 0.0), (2, 5.0), (10, 10.0)])
def test_stall_abort_is_never_before_the_report(abort_after, expected):
    # None: abort when the stall is reported; 0: report only; otherwise at that wait, the timeout at the soonest
    assert Watchdog(LocalComm(), timeout=5, abort_after=abort_after).abort_after == expected


@pytest.mark.parametrize("flag", ["stall_timeout", "stall_abort"])
def test_negative_stall_flags_are_refused(flag):
    from mpi_sgd.config import TrainConfig

    with pytest.raises(ValueError, match=f"--{flag.replace('_', '-')} must be 0 or more seconds"):
        TrainConfig(**{flag: -1.0})


def test_the_killed_rank_is_named_when_its_peer_ended_too():
    from mpi_sgd.launchers import explain_death

    # A gloo peer sees the connection close and aborts: hydra may report it before the killed rank.
    both = HYDRA.replace(
        "=   BAD TERMINATION",
        "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   PID 4100 RUNNING AT a\n=   EXIT CODE: 1\n"
        "=   BAD TERMINATION",
        1,
    )
    assert both.index("PID 4100") < both.index("PID 4242")
    assert explain_death(both) == "rank 1 (pid 4242 on b) killed by signal 9"


# What Intel MPI 2021's hydra printed when rank 1 of a two-rank job was SIGKILLed: it ended rank 0
# with the same signal and reported both, in rank order.
INTEL = """processes: rank 0 = pid 25244 on vm, rank 1 = pid 25245 on vm
mpi_sgd fault: rank 1, step 3: kill (MPI_SGD_FAULT=1:3:kill) at 1000.0

===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 0 PID 25244 RUNNING AT vm
=   KILLED BY SIGNAL: 9 (Killed)
===================================================================================

===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 1 PID 25245 RUNNING AT vm
=   KILLED BY SIGNAL: 9 (Killed)
===================================================================================
"""


def test_intel_mpis_report_of_every_rank_is_not_read_as_the_first_to_die():
    from mpi_sgd.faultmatrix import CASES, judge
    from mpi_sgd.launchers import explain_death

    said = explain_death(INTEL)
    assert said.startswith("rank 0 or rank 1 ended the job (pid 25244 on vm killed by signal 9; pid 25245")
    assert said.endswith("cannot be told")
    one = INTEL.split("\n\n=====")[0] + "\n\n=====" + INTEL.split("\n\n=====")[2]  # the start line and rank 1's block
    assert explain_death(one) == "rank 1 (pid 25245 on vm) killed by signal 9"
    assert "exited with status 3" in explain_death(INTEL.replace("KILLED BY SIGNAL: 9 (Killed)", "EXIT CODE: 3"))
    kill = next(c for c in CASES if c.fault and c.fault.endswith("kill"))
    assert judge(kill, 9, INTEL, 990.0, 1000.5, 3).passed  # says it cannot tell, naming rank 1 among them
    assert not judge(kill, 9, INTEL.replace("RANK 1 PID", "RANK 2 PID"), 990.0, 1000.5, 3).passed


def test_a_failed_cases_report_keeps_each_streams_last_lines():
    from mpi_sgd.faultmatrix import _last_lines, _text

    # A timed-out run's output arrives as bytes (or None): read as text, never as b'...'.
    assert _text(b"hydra: one\ntwo") == "hydra: one\ntwo" and _text(None) == "" and _text("x") == "x"
    lines = "\n".join(f"line {i}" for i in range(40)) + "\n\n"
    assert _last_lines(lines).splitlines() == [f"line {i}" for i in range(25, 40)]
    assert _last_lines("") == "(nothing)"


@pytest.mark.parametrize(
    "said, family",
    [
        ("HYDRA build details:\n    Version:   5.0.2\n", "hydra"),
        ("prterun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n", "openmpi"),
        ("mpiexec.openmpi (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n", "openmpi"),
        ("something else 1.0\n", "other"),
    ],
)
def test_the_launcher_family_from_what_mpiexec_version_says(tmp_path, said, family):
    import signal

    from mpi_sgd.launchers import launcher_family, stop_signal

    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{said}EOF\n")
    fake.chmod(0o755)
    assert launcher_family(str(fake)) == family
    assert stop_signal(str(fake)) == (signal.SIGUSR1 if family == "openmpi" else signal.SIGTERM)


def test_the_status_a_launcher_passes_on_after_a_signal(tmp_path):
    from mpi_sgd.launchers import statuses_after_signal

    for said, status in (
        ("HYDRA build details:\n    Version:   4.0.2\n", {0, 75}),
        ("HYDRA build details:\n    Version:   5.0.2\n", {75}),
        ("mpiexec (OpenRTE) 4.1.4\n", {75}),
    ):
        fake = tmp_path / "mpiexec"
        fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{said}EOF\n")
        fake.chmod(0o755)
        assert statuses_after_signal(str(fake), 75) == status, said


def test_a_thread_that_does_not_stop_is_described_by_what_the_os_says():
    # What close() prints when the monitor's thread never signals that its loop ended: whether
    # Python still counts it alive, and the kernel's view of its OS thread (or that it is gone).
    import re
    import threading

    from mpi_sgd.comm.wrappers.monitor import _os_view

    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        live = _os_view(thread)
    finally:
        release.set()
        thread.join()
    # S once it sleeps in its wait; R (wchan 0) if it has not got there yet
    assert re.fullmatch(rf"Python: alive; OS thread {thread.native_id}: state [RS], waiting in \S+", live), live
    # join() returns once Python has let go of the thread; its OS thread can still be on its way
    # out for a moment (seen under mpirun -n 2 on two busy cores: "state R, waiting in 0").
    ended = f"Python: ended; OS thread {thread.native_id}: "
    deadline = time.monotonic() + 10
    while (view := _os_view(thread)) != ended + "gone" and time.monotonic() < deadline:
        assert view.startswith(ended), view
        time.sleep(0.01)
    assert view == ended + "gone", view
