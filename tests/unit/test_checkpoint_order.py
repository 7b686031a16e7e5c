"""Which checkpoint is "newest": the one written last, not the highest step. A run resumed from an
earlier step into the same directory (a rollback) must be the one ``latest`` names, ``--resume
auto`` takes and ``keep`` keeps; a step written twice is swapped in whole; a job saves a step once.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from mpi_sgd.checkpoint import read_state, serialize, store, trainer_state
from mpi_sgd.preemption import Preempted
from tests.unit.test_checkpoint_dirs import trainer
from tests.unit.test_preemption import signal_in_step_3


def _save(d: str, step: int, tag: str = "", keep: int = 0) -> str:
    return store.save(serialize({"step": step, "tag": tag}), {"step": step}, d, step, keep)


def test_a_rollback_into_the_directory_is_what_latest_auto_and_keep_follow(tmp_path):
    d = str(tmp_path / "ck")
    for step in (900, 950, 1000):
        _save(d, step, "abandoned", keep=3)
    _save(d, 860, "rollback", keep=3)  # resumed from step 850 of the same run, after a divergence
    assert store.latest(d) == os.path.join(d, store.step_name(860))
    path, _, meta = store.newest_valid(d, print)
    assert path == store.latest(d) and meta["step"] == 860  # --resume auto agrees with latest
    # keep: the abandoned run's oldest goes first, never the new run's own
    assert sorted(os.listdir(d)) == ["latest", *map(store.step_name, (860, 950, 1000))]
    _save(d, 870, "rollback", keep=3)
    assert sorted(os.listdir(d)) == ["latest", *map(store.step_name, (860, 870, 1000))]
    assert read_state(d)["tag"] == "rollback"


def test_without_the_written_record_the_files_age_decides(tmp_path):
    d = str(tmp_path / "ck")
    old, new = _save(d, 2), _save(d, 1)
    for path, when in ((old, 1000.0), (new, 2000.0)):  # as saved before meta.json recorded the time
        meta_path = os.path.join(path, store.META)
        text = open(meta_path).read().replace('"written"', '"written_not"')
        open(meta_path, "w").write(text)
        os.utime(meta_path, (when, when))
    assert store.checkpoints(d) == [new, old]


def _set_written(path: str, when: float) -> None:
    meta_path = os.path.join(path, store.META)
    meta = json.loads(open(meta_path).read())
    meta["written"] = when
    open(meta_path, "w").write(json.dumps(meta))


def test_a_clock_that_disagrees_cannot_make_an_older_checkpoint_newest(tmp_path):
    # step 25 saved by a root whose clock ran an hour ahead (another host, or a clock set back since)
    d = str(tmp_path / "ck")
    paths = {step: _save(d, step, keep=3) for step in (10, 20, 25)}
    _set_written(paths[25], time.time() + 3600)
    _set_written(paths[10], time.time() + 7200)
    for step in (30, 40):
        _save(d, step, keep=3)
    path, _, meta = store.newest_valid(d, print)
    assert meta["step"] == 40 and path == store.latest(d)  # --resume auto agrees with latest
    # keep deletes by the order of writing: 10 and 20 went, the skewed 25 is now the oldest kept
    assert sorted(os.listdir(d)) == ["latest", *map(store.step_name, (25, 30, 40))]
    assert [json.loads(open(os.path.join(p, store.META)).read())["seq"] for p in store.checkpoints(d)] == [5, 4, 3]


@pytest.mark.parametrize("atomic", [True, False], ids=["exchange", "two-renames"])
def test_a_step_written_again_is_swapped_in_whole(tmp_path, monkeypatch, atomic):
    if not atomic:  # a file system without renameat2's exchange (NFS): the old copy goes aside first
        monkeypatch.setattr(store, "_exchange", lambda a, b: False)
    d = str(tmp_path / "ck")
    _save(d, 5, "first")
    _save(d, 5, "second")
    assert read_state(d)["tag"] == "second" and sorted(os.listdir(d)) == ["latest", store.step_name(5)]


def test_a_step_is_saved_once_when_the_loop_ends_where_a_save_was_just_made(tmp_path, monkeypatch):
    saved = []
    real = trainer_state.save
    monkeypatch.setattr(
        trainer_state, "save", lambda blob, meta, d, step, keep: saved.append(step) or real(blob, meta, d, step, keep)
    )
    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=1, checkpoint_every=1, max_steps=1, keep_checkpoints=0).train()
    assert saved == [1]  # the mid-epoch save of step 1; the end of the loop does not write it again


def test_a_signal_with_a_state_that_could_not_be_saved_says_so(tmp_path, monkeypatch):
    d = str(tmp_path / "ck")
    t = trainer(checkpoint=d, epochs=5)
    signal_in_step_3(t, monkeypatch)
    real_writer = trainer_state._writer
    monkeypatch.setattr(  # what the root does with parameters that are not finite: writes nothing
        trainer_state, "_writer", lambda d, comm, *a: None if a[-3].step == 3 else real_writer(d, comm, *a)
    )
    with pytest.raises(Preempted) as e:
        t.train()
    assert e.value.saved is None and str(e.value) == (
        f"stopped after step 3 on SIGTERM; step 3 not saved (its parameters are not finite): "
        f"--resume auto goes on from the last good checkpoint in {d}"
    )


def test_a_trainer_built_by_hand_takes_the_directorys_lock_at_its_first_save(tmp_path):
    from mpi_sgd.checkpoint import lock

    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=1).train()  # Trainer(...), not Trainer.from_config: no lock at the start
    assert os.path.realpath(d) in lock._held  # this process holds it, as a job would for its life
