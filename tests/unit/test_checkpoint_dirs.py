"""Checkpoint directories without MPI: layout, pruning, checksums, corrupt and foreign contents, resume
auto, kills at every step of a save (real SIGKILLs of forked children), non-finite states, and
what a resume with another configuration says."""

from __future__ import annotations

import json
import os

import pytest
import torch

from mpi_sgd import checkpoint, data, gradsync
from mpi_sgd.checkpoint import CheckpointError, drill, store
from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import build_model
from mpi_sgd.trainer import Trainer, make_optimizer


def trainer(ds: data.Dataset | None = None, **kw) -> Trainer:
    cfg = TrainConfig(**{"model": "ffnet", "dataset": "toy", "epochs": 2, "progress": False, **kw})
    ds = data.toy_regression(num_samples=64, input_size=4) if ds is None else ds
    torch.manual_seed(0)
    model = build_model(cfg.model, (4,), 1)
    comm = LocalComm()
    return Trainer(model, make_optimizer(cfg, model), gradsync.make("flat", model, comm), ds, comm, cfg)


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def test_layout_latest_and_keep(tmp_path):
    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=4, keep_checkpoints=2).train()  # 2 steps per epoch: saves at 2, 4, 6, 8
    assert sorted(os.listdir(d)) == [".lock", "latest", "step-00000006", "step-00000008"]  # .lock: the job's lock
    assert open(os.path.join(d, "latest")).read().strip() == "step-00000008"
    meta = json.loads(open(os.path.join(d, "step-00000008", "meta.json")).read())
    assert meta["step"] == 8 and meta["config"]["model"] == "ffnet" and len(meta["sha256"]) == 64
    resumed = trainer(epochs=5)
    assert resumed.load_checkpoint(d).endswith("step-00000008") and resumed.step == 8


def test_corrupted_bytes_are_refused_and_auto_passes_over_them(tmp_path, capsys):
    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=2, keep_checkpoints=0).train()
    state = os.path.join(d, "step-00000004", "state.pt")
    raw = bytearray(open(state, "rb").read())
    raw[-2000] ^= 0x01  # one bit of a tensor: torch would load it without a word
    open(state, "wb").write(bytes(raw))
    with pytest.raises(CheckpointError) as e:
        trainer(epochs=3).load_checkpoint(d)
    assert "is corrupt" in one_line(e) and "checksum" in str(e.value)
    resumed = trainer(epochs=3)
    assert resumed.load_checkpoint(d, auto=True).endswith("step-00000002")
    assert resumed.step == 2 and "warning: skipping checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["empty", "random bytes", "truncated", "no meta", "foreign meta", "missing key"])
def test_damaged_checkpoint_directories_give_one_line(tmp_path, damage):
    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=1).train()
    step = os.path.join(d, "step-00000002")
    state, meta = os.path.join(step, "state.pt"), os.path.join(step, "meta.json")
    if damage == "empty":
        open(state, "wb").close()
    elif damage == "random bytes":
        open(state, "wb").write(os.urandom(4096))
    elif damage == "truncated":
        open(state, "r+b").truncate(1000)
    elif damage == "no meta":
        os.unlink(meta)
    elif damage == "foreign meta":
        open(meta, "w").write("[1, 2, 3]")
    else:  # a well-formed checkpoint, checksum and all, that lacks what the trainer needs
        blob = checkpoint.serialize({"model": {}})
        store.save(blob, {}, str(tmp_path / "other"), 1)
        step = str(tmp_path / "other")
    with pytest.raises(CheckpointError) as e:
        trainer(epochs=3).load_checkpoint(step)
    assert one_line(e)
    assert not checkpoint.read(str(tmp_path / "nothing"), auto=True)  # auto with nothing there: start afresh


def test_resume_auto_with_only_corrupt_checkpoints_refuses_unless_told(tmp_path, capsys):
    # A directory of checkpoints none of which reads is a fault to fix, not a run to overwrite.
    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=1).train()
    open(os.path.join(d, "step-00000002", "state.pt"), "ab").write(b"x")
    with pytest.raises(CheckpointError) as e:
        trainer(epochs=3).load_checkpoint(d, auto=True)
    assert "none of the 1 checkpoint(s)" in one_line(e) and "step-00000002" in one_line(e)
    assert "--resume auto-or-fresh" in one_line(e)
    assert trainer(epochs=3).load_checkpoint(d, auto="or-fresh") is None  # told to: a fresh start
    assert "is corrupt" in capsys.readouterr().err


def test_another_model_says_which_flags_differ(tmp_path):
    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=1).train()
    with pytest.raises(CheckpointError) as e:
        trainer(model="mlp", epochs=3).load_checkpoint(d)
    assert "was written for another model" in one_line(e) and "--model ffnet, here mlp" in str(e.value)
    with pytest.raises(CheckpointError) as e:
        trainer(optimizer="adam", epochs=3).load_checkpoint(d)
    assert "another --optimizer" in one_line(e) and "--optimizer sgd, here adam" in str(e.value)


def test_a_non_finite_state_never_replaces_the_last_good_one(tmp_path, capsys):
    d = str(tmp_path / "ck")
    t = trainer(checkpoint=d, epochs=1)
    t.train()
    with torch.no_grad():
        next(t.model.parameters())[0] = float("nan")
    t.step += 1
    t._save_checkpoint(d)
    assert store.checkpoints(d) == [os.path.join(d, "step-00000002")]
    assert "not saving a checkpoint at step 3" in capsys.readouterr().err


def test_a_fresh_run_into_a_used_directory_is_refused(tmp_path):
    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=1).train()
    with pytest.raises(ValueError, match="already holds checkpoints of another run; continue it with --resume auto"):
        TrainConfig(checkpoint=d)
    TrainConfig(checkpoint=d, resume="auto")


def test_a_resume_from_elsewhere_into_a_used_directory_is_refused(tmp_path):
    # Run B's checkpoints written into run A's directory would interleave with A's: latest, --resume
    # auto and --keep-checkpoints would then mix the two runs' models.
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    trainer(checkpoint=a, epochs=1).train()
    trainer(checkpoint=b, epochs=1).train()
    with pytest.raises(ValueError) as e:
        TrainConfig(checkpoint=a, resume=os.path.join(b, "step-00000002"))
    assert "already holds checkpoints of another run, and --resume" in one_line(e)
    TrainConfig(checkpoint=a, resume=os.path.join(a, "step-00000002"))  # a rollback within A: allowed
    TrainConfig(checkpoint=a, resume=a)
    os.symlink(a, str(tmp_path / "a-link"))
    TrainConfig(checkpoint=str(tmp_path / "a-link"), resume=os.path.join(a, "step-00000002"))
    TrainConfig(checkpoint=str(tmp_path / "c"), resume=b)  # from B into a new directory: a branch, allowed


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_unwritable_checkpoint_paths_are_refused_before_training(tmp_path, where):
    f = tmp_path / "f"
    f.write_text("")
    path = str(f) if where == "a file" else str(f / "ck")
    with pytest.raises(ValueError, match="--checkpoint") as e:
        TrainConfig(checkpoint=path)
    assert "\n" not in str(e.value)


POINTS = drill.save_points()


def test_a_save_has_the_steps_the_drill_kills_at():
    # The drill must cover the whole save: both files, the rename, the pointer and the pruning.
    assert len(POINTS) >= 10 and POINTS[-1] == "before removing step-00000001", POINTS
    assert "before rename to step-00000002" in POINTS and "before replacing latest" in POINTS


@pytest.mark.parametrize("point", range(len(POINTS)), ids=POINTS)
def test_sigkill_at_every_step_of_a_save_leaves_a_loadable_checkpoint(point):
    ok, seconds, message = drill.kill_during_save(point)
    assert ok, message
    # before the rename the old checkpoint is what a resume finds; after it, the new one
    want = 1 if point <= POINTS.index("before rename to step-00000002") else 2
    assert f"resumes from step {want}" in message


def test_flags_given_on_resume_replace_the_checkpoints_and_the_rest_continue(tmp_path, capsys):
    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=1, lr=0.02, momentum=0.5).train()
    capsys.readouterr()
    # --lr given: it replaces 0.02, says so, trains with it and records it in the next checkpoint
    t = trainer(checkpoint=d, resume="auto", epochs=2, lr=1e-9)
    t.load_checkpoint(d, auto=True, given={"lr"})
    assert "--lr 1e-09 replaces 0.02 from the checkpoint" in capsys.readouterr().out
    assert [g["lr"] for g in t.optimizer.param_groups] == [1e-9]
    assert [g["momentum"] for g in t.optimizer.param_groups] == [0.5]  # not given: the checkpoint's
    t.train()
    meta = json.loads(open(os.path.join(store.latest(d), "meta.json")).read())
    assert (meta["config"]["lr"], meta["config"]["momentum"]) == (1e-9, 0.5)
    # nothing given: the default --lr 0.05 of this command line does not replace the run's 1e-9
    t = trainer(checkpoint=d, resume="auto", epochs=3)
    t.load_checkpoint(d, auto=True, given=set())
    assert t.cfg.lr == 1e-9 and [g["lr"] for g in t.optimizer.param_groups] == [1e-9]
    assert "replaces" not in capsys.readouterr().out


def test_what_a_command_line_gave_is_told_from_defaults():
    from mpi_sgd.args import ArgumentParser

    parser = ArgumentParser()
    parser.add_flags(TrainConfig)
    assert parser.given(["--lr=0.1", "--epochs", "3", "--no-progress"]) == {"lr", "epochs", "progress"}


def test_a_checkpoint_resumes_only_on_the_data_it_was_trained_on(tmp_path):
    d = str(tmp_path / "ck")
    trainer(checkpoint=d, epochs=1).train()
    assert trainer(epochs=2).load_checkpoint(d)  # the same samples: it goes on
    # the same shapes, other samples: resuming would carry the epoch on over them
    other = data.toy_regression(num_samples=64, input_size=4, seed=5)
    with pytest.raises(CheckpointError) as e:
        trainer(other, epochs=2).load_checkpoint(d)
    text = one_line(e)
    assert "was trained on other data (64 training and 0 held-out samples, hash " in text
    assert "the data file's contents differ from when it was made" in text
    with pytest.raises(CheckpointError) as e:
        trainer(other, epochs=2, dataset="mine.npz").load_checkpoint(d)
    assert "it was made with --dataset toy, here mine.npz" in one_line(e)
    # a checkpoint written before the data was recorded resumes unchecked, as it always did
    for step in os.listdir(d):
        if step.startswith("step-"):
            meta_path = os.path.join(d, step, "meta.json")
            meta = json.loads(open(meta_path).read())
            del meta["data"]
            open(meta_path, "w").write(json.dumps(meta))
    assert trainer(other, epochs=2).load_checkpoint(d)


def test_the_data_hash_a_checkpoint_records_does_not_change_between_versions():
    # Every checkpoint's meta.json holds it and a resume compares it: a new way of hashing would
    # refuse every older checkpoint as trained on other data. These values are the first version's.
    from mpi_sgd.agree import fingerprint

    x, y = torch.arange(12, dtype=torch.float32).reshape(4, 3), torch.tensor([0, 1, 1, 0])
    assert fingerprint(x, y) == "827424b3d90df716"
    assert fingerprint(x.double(), y) == "c4d2d44c3bf33fcd"  # the dtype is part of the data
    assert fingerprint(x.t().contiguous().t(), y) == "827424b3d90df716"  # the layout is not
