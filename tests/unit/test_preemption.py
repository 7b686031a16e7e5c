"""SIGTERM and SIGUSR1 stop training after the step in progress, saved, on every rank alike.

One process here (the agreement is an all-reduce of MAX over ranks: tests/integration has the
two-rank job, signalled through mpiexec as Slurm would)."""

from __future__ import annotations

import os
import signal

import pytest

from mpi_sgd import gradsync
from mpi_sgd.checkpoint import store
from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.preemption import Preempted, Preemption
from tests.unit.test_checkpoint_dirs import trainer


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_becomes_a_flag_the_ranks_agree_on(signum):
    with Preemption(LocalComm()) as p:
        assert p.agreed(1) == 0
        os.kill(os.getpid(), signum)
        assert p.agreed(2) == signum  # one process looks after every step
    assert signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler)  # handlers put back


def signal_in_step_3(t, monkeypatch) -> None:
    """SIGTERM to this process in the middle of ``t``'s third step (``t`` averages with ``flat``)."""
    real = gradsync.FlatAllReduce.wait

    def wait_and_signal_at_step_3(self):
        real(self)
        if t.step == 2:  # this is the third step: the signal comes in mid-step
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(gradsync.FlatAllReduce, "wait", wait_and_signal_at_step_3)


def test_training_stops_after_the_step_and_saves_it(tmp_path, monkeypatch):
    d = str(tmp_path / "ck")
    t = trainer(checkpoint=d, epochs=5)
    signal_in_step_3(t, monkeypatch)
    with pytest.raises(Preempted) as e:
        t.train()
    assert e.value.step == 3 and str(e.value) == f"saved step 3 to {d} on SIGTERM; resume with --resume auto"
    assert store.latest(d).endswith("step-00000003")
    again = trainer(checkpoint=d, resume="auto", epochs=5)
    assert again.load_checkpoint(d, auto=True).endswith("step-00000003") and again.step == 3


def test_checkpoint_every_saves_within_the_epoch(tmp_path):
    d = str(tmp_path / "ck")
    t = trainer(checkpoint=d, epochs=1, checkpoint_every=2, keep_checkpoints=0)
    t.train()
    steps = sorted(int(os.path.basename(p).split("-")[1]) for p in store.checkpoints(d))
    assert steps == [*range(2, t.steps_per_epoch, 2), t.steps_per_epoch]
