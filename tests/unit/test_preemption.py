"""SIGTERM and SIGUSR1 are only noted, agreed on at the step's end, and given back afterwards.
Whole jobs: tests/integration/test_preemption.py and the fault matrix's signal rows."""

from __future__ import annotations

import os
import signal

import pytest

from mpi_sgd.comm import init
from mpi_sgd.preemption import EXIT_PREEMPTED, Preempted, Preemption


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_is_noted_and_told_at_the_next_step(sig):
    before = signal.getsignal(sig)
    p = Preemption(init("local"), enabled=True)
    try:
        assert p.due() == 0
        os.kill(os.getpid(), sig)  # the process lives on: the handler only notes it
        assert p.due() == sig and p.due() == sig  # and it stays noted
    finally:
        p.close()
    assert signal.getsignal(sig) == before


def test_without_a_checkpoint_the_signals_keep_their_default():
    before = signal.getsignal(signal.SIGTERM)
    p = Preemption(init("local"), enabled=False)
    assert signal.getsignal(signal.SIGTERM) == before and p.due() == 0


def test_the_line_and_the_status():
    e = Preempted(signal.SIGTERM, 86, "runs/ck")
    assert str(e) == "saved step 86 to runs/ck on SIGTERM; resume with --resume auto"
    assert e.status == EXIT_PREEMPTED == 75
