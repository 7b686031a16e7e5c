"""The non-finite verdict read a step late (``--nonfinite-verdict next-step``, a GPU's default), on
the CPU, at any world size (make test: 1 and 3; mpirun -n 2).

The semantics checked against the verdict read at once (``now``): the bad step is left out on every
rank, parameters *and* optimizer state untouched (the fused optimizer's ``found_inf``); every rank
learns it one step later, with the message naming the bad step; ``stop`` stops every rank there,
``skip`` goes on. References are runs of the same data with the verdict read at once. The two use
different optimizer implementations (fused and not), whose float64 results differ by rounding
alone: compared to 1e-12 relative (a few units in the last place after a handful of steps).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

from mpi_sgd.config import TrainConfig
from mpi_sgd.trainer import Trainer, TrainingDiverged

from .test_reliability import config, params, poisoned, stopped_by_a_nan_in_transit, toy

pytestmark = pytest.mark.mpi


@pytest.fixture
def comm(world):
    return world  # MPI's world, with no abort hook: a failing test must not end the job here


def late(**kw) -> TrainConfig:
    return config(nonfinite_verdict="next-step", **kw)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_bad_step_is_left_out_with_the_optimizer_state_untouched(comm, optimizer):
    last = comm.size - 1
    t = Trainer.from_config(late(on_nonfinite="skip", max_steps=5, optimizer=optimizer), poisoned(comm, 3, last), comm)
    assert t.late is not None and t.optimizer.defaults["fused"]
    t.train()  # ends with the replica check: identical on every rank
    now = Trainer.from_config(
        config(on_nonfinite="skip", max_steps=5, optimizer=optimizer), poisoned(comm, 3, last), comm
    )
    assert now.late is None
    now.train()
    # The steps after the skipped one (the poisoned sample may come round again in epoch 1): a momentum
    # or Adam state touched by a skipped step would show here.
    assert t.skipped == now.skipped >= 1 and close(params(t), params(now))
    assert comm.allgather_obj(t.skipped) == [t.skipped] * comm.size


@pytest.mark.parametrize("strategy", ["naive", "bucketed"])
def test_stop_comes_one_step_later_naming_the_bad_step(comm, strategy):
    last = comm.size - 1
    t = Trainer.from_config(late(strategy=strategy, bucket_mb=0.001), poisoned(comm, 3, last), comm)
    with pytest.raises(TrainingDiverged) as e:
        t.train()
    text = str(e.value)
    assert f"loss nan in step 3 (epoch 0) on rank {last};" in text
    assert t.step == 3 and comm.allgather_obj(text) == [text] * comm.size  # learnt after step 4, everywhere
    # Step 4 was applied, step 3 was not: as a run that skipped step 3 and stopped after step 4.
    skipped = Trainer.from_config(
        config(strategy=strategy, bucket_mb=0.001, on_nonfinite="skip", max_steps=4), poisoned(comm, 3, last), comm
    )
    skipped.train()
    assert close(params(t), params(skipped))


def test_a_bad_last_step_is_read_before_the_run_ends(comm):
    last = comm.size - 1
    t = Trainer.from_config(late(max_steps=3), poisoned(comm, 3, last), comm)
    with pytest.raises(TrainingDiverged, match=rf"loss nan in step 3 \(epoch 0\) on rank {last};"):
        t.train()
    clean = Trainer.from_config(late(max_steps=2), toy(comm), comm)
    clean.train()
    assert torch.equal(params(t), params(clean))  # the same fused steps, and step 3 left out


def test_a_sum_corrupted_in_transit_is_named_a_step_late(comm):
    t, text = stopped_by_a_nan_in_transit(comm, late(strategy="bucketed", bucket_mb=0.001))
    assert t.step == 3 and comm.allgather_obj(text) == [text] * comm.size


def test_what_needs_the_verdict_at_once_is_refused_or_reads_it_at_once():
    for kw, why in (
        (dict(zero=1), "--zero"),
        (dict(amp="fp16", dtype="float32"), "fp16"),
        (dict(adascale=True, grad_accum=2), "adascale"),
    ):
        with pytest.raises(ValueError, match=f"--nonfinite-verdict next-step cannot be used here: .*{why}"):
            late(**kw)
    with pytest.raises(ValueError, match="unknown --nonfinite-verdict 'later'"):
        config(nonfinite_verdict="later")


def test_a_checkpoint_saved_reading_the_verdict_at_once_resumes_reading_it_late(comm):
    # The saved optimizer's groups say "not fused"; loading them must not take the fused step away.
    last = comm.size - 1
    folder = comm.bcast_obj(tempfile.mkdtemp(prefix="mpi-sgd-late-") if comm.is_root else None)
    d = os.path.join(folder, "ck")
    # the same data throughout (a resume refuses other data): the NaN lies in step 3, after the save
    Trainer.from_config(config(max_steps=2, checkpoint=d), poisoned(comm, 3, last), comm).train()
    runs = []
    for cfg in (late(max_steps=5, on_nonfinite="skip"), config(max_steps=5, on_nonfinite="skip")):
        t = Trainer.from_config(cfg, poisoned(comm, 3, last), comm)
        t.load_checkpoint(d)
        t.train()
        runs.append(t)
    assert runs[0].late is not None and all(g["fused"] for g in runs[0].optimizer.param_groups)
    assert runs[0].skipped == runs[1].skipped >= 1 and close(params(runs[0]), params(runs[1]))
    comm.barrier()
    if comm.is_root:
        shutil.rmtree(folder)
