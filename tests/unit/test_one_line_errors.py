"""What a run cannot use is refused with one line, before any communication: a backend or device
this machine lacks, inputs a model cannot take, a checkpoint that is unreadable, someone else's,
for another model or optimizer, or already finished. examples/sync_sgd.py turns each ValueError
here into that line and exit status 2 (tests/integration/test_first_hour.py runs it so)."""

from __future__ import annotations

import argparse

import pytest
import torch

from mpi_sgd import checkpoint, data
from mpi_sgd.checkpoint import CheckpointError
from mpi_sgd.comm.backends import unavailable
from mpi_sgd.comm.backends.local import LocalComm
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import build_model, check_input
from tests.unit.test_checkpoint_dirs import trainer  # the same tiny trainer


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text and "weights_only" not in text, text
    return text


# -- machine ------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_cuda_device_without_a_gpu():
    with pytest.raises(ValueError) as e:
        TrainConfig(device="cuda").check_machine(1)
    assert one_line(e).startswith("--device cuda: ") and "--device cpu" in str(e.value)


def test_a_flag_the_configuration_would_ignore_is_refused():
    with pytest.raises(ValueError) as e:
        TrainConfig(zero=3, strategy="naive").check_given({"zero", "strategy"})
    assert one_line(e) == (
        "--strategy naive has no effect with --zero 3, which reduces gradients in its own units; give one of the two"
    )
    TrainConfig(zero=3).check_given({"zero"})  # the default strategy, not typed: nothing dropped
    TrainConfig(strategy="naive").check_given({"strategy"})
    with pytest.raises(ValueError, match="--grad-accum must be at least 1, got 0"):
        TrainConfig(grad_accum=0)


def test_unknown_device_and_local_backend_in_a_job():
    with pytest.raises(ValueError, match="unknown --device 'gpu'"):
        TrainConfig(device="gpu").check_machine(1)
    for other in ("mps", "meta", "xpu:0"):  # devices torch knows and the trainer does not run on
        with pytest.raises(ValueError) as e:
            TrainConfig(device=other).check_machine(1)
        assert one_line(e) == f"--device {other}: the trainer runs on cpu or cuda, not {other.split(':')[0]}"
    with pytest.raises(ValueError, match="--backend local is one process, but this job has 2"):
        TrainConfig(backend="local").check_machine(2)
    TrainConfig(backend="local").check_machine(1)
    TrainConfig().check_machine(4)  # mpi4py on the CPU: always available


@pytest.mark.parametrize(
    "backend", ["mpi", "nccl"], ids=["torch-mpi", "nccl"]
)  # an id "mpi" reads as pytest-mpi's mark
def test_missing_torch_backend_says_what_to_use(backend):
    if not unavailable(backend):
        pytest.skip(f"this torch has {backend}")
    with pytest.raises(ValueError) as e:
        TrainConfig(backend=backend, device="cuda" if backend == "nccl" else "cpu").check_machine(2)
    assert one_line(e).startswith(f"--backend {backend} is not available") or "--device cuda:" in str(e.value)


def test_nccl_needs_a_cuda_device():
    if unavailable("nccl"):
        pytest.skip("this torch has no NCCL, refused before the device is looked at")
    with pytest.raises(ValueError, match="add --device cuda"):
        TrainConfig(backend="nccl").check_machine(2)


# -- inputs a model cannot take ----------------------------------------------------------------
@pytest.mark.parametrize("shape", [(100,), (784,), (3, 8, 8), (1, 8, 6), (1, 2, 2)])
def test_lenet_wants_square_one_channel_images(shape):
    with pytest.raises(ValueError) as e:
        build_model("lenet", shape, 10)
    assert one_line(e).startswith("--model lenet needs square one-channel images")
    assert str(shape) in str(e.value)


def test_lenet_takes_images_with_or_without_a_channel_axis():
    for shape in [(1, 8, 8), (8, 8), (1, 28, 28)]:
        x = torch.zeros(2, *shape)
        check_input(build_model("lenet", shape, 10), x, "lenet")


def test_a_model_that_cannot_take_the_input_fails_in_one_line():
    model = build_model("mlp", (6,), 2)
    with pytest.raises(ValueError) as e:
        check_input(model, torch.zeros(2, 5), "mlp")  # 5 features where the model was made for 6
    assert one_line(e).startswith("--model mlp cannot take samples of shape (5,)")
    assert model.training  # the check left the model as it found it


def test_negative_class_labels_are_refused(tmp_path):
    import numpy as np

    np.savez(tmp_path / "neg.npz", x=np.zeros((4, 2), np.float32), y=np.array([0, 1, -1, 1]))
    with pytest.raises(ValueError, match="class indices and must be >= 0, found -1"):
        data.load(str(tmp_path / "neg.npz"))


def test_one_hot_and_wide_integer_labels_are_refused_not_flattened(tmp_path):
    import numpy as np

    x = np.zeros((6, 3), np.float32)
    np.savez(tmp_path / "onehot.npz", x=x, y=np.eye(3, dtype=np.int64)[[0, 1, 2, 0, 1, 2]])
    with pytest.raises(ValueError) as e:
        data.load(str(tmp_path / "onehot.npz"))
    assert "y is one-hot (6x3)" in one_line(e) and "y.argmax(1)" in one_line(e)
    np.savez(tmp_path / "wide.npz", x=x, y=np.arange(12).reshape(6, 2))
    with pytest.raises(ValueError, match=r"one class index per sample, shape \(6,\), not 6x2"):
        data.load(str(tmp_path / "wide.npz"))
    np.savez(tmp_path / "column.npz", x=x, y=np.array([[0], [1], [2], [0], [1], [2]]))
    assert data.load(str(tmp_path / "column.npz")).y.tolist() == [0, 1, 2, 0, 1, 2]  # (N, 1) is one per sample


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04truncated", b"every line of a text file"])
def test_empty_or_truncated_data_files_are_one_line(tmp_path, content):
    for suffix in (".npz", ".pt"):
        path = tmp_path / f"bad{suffix}"
        path.write_bytes(content)
        with pytest.raises(ValueError) as e:
            data.load(str(path))
        assert one_line(e).startswith(f"cannot read data file {str(path)!r} (empty, truncated or not this format)")


def test_data_files_of_odd_shapes_are_one_line(tmp_path):
    import io
    import zipfile

    import numpy as np

    cases = {
        "scalar-x.npz": (dict(x=np.float32(1.0), y=np.array([0])), "x is a single number"),
        "scalar-y.pt": (dict(x=torch.zeros(3, 2), y=torch.tensor(1)), "y is a single number"),
        "no-features.npz": (dict(x=np.zeros((4, 0), np.float32), y=np.arange(4)), "x has no features (shape (4, 0))"),
        "no-targets.npz": (dict(x=np.zeros((4, 2), np.float32), y=np.zeros((4, 0))), "y has no targets"),
        "sparse.pt": (dict(x=torch.eye(4).to_sparse(), y=torch.arange(4)), "x is a torch.sparse_coo tensor"),
        "float8.pt": (dict(x=torch.zeros(4, 2).to(torch.float8_e4m3fn), y=torch.arange(4)), "a storage format"),
        "meta.pt": (dict(x=torch.zeros(4, 2), y=torch.empty(4, dtype=torch.long, device="meta")), "y is a meta"),
        "uint64.npz": (
            dict(x=np.zeros((2, 2), np.float32), y=np.array([0, 2**63 + 5], np.uint64)),
            "y holds a class index of 2**63 or more",
        ),
    }
    for name, (arrays, message) in cases.items():
        path = str(tmp_path / name)
        np.savez(path, **arrays) if name.endswith(".npz") else torch.save(arrays, path)
        with pytest.raises(ValueError) as e:
            data.load(path)
        assert message in one_line(e), name
    # a header that claims ten thousand terabytes (a corrupt or hostile file): refused, not a MemoryError
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**8, 10**8)})
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as z:
        z.writestr("x.npy", header.getvalue())
        z.writestr("y.npy", header.getvalue())
    with pytest.raises(ValueError) as e:
        data.load(str(tmp_path / "huge.npz"))
    assert one_line(e).startswith("cannot read data file")


def test_seeds_are_bounded_before_they_overflow():
    TrainConfig(seed=2**32 - 1)
    for bad in (-1, 2**32, 2**63):
        with pytest.raises(ValueError, match=rf"--seed must be in \[0, 2\*\*32\), got {bad}$"):
            TrainConfig(seed=bad)


# -- checkpoints ---------------------------------------------------------------------------------
def written(tmp_path, name="ckpt.pt", **kw) -> str:
    path = str(tmp_path / name)
    trainer(checkpoint=path, **kw).train()
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a torch checkpoint, or a truncated one"),
        (b"hello, not a checkpoint" * 10, "not a torch checkpoint, or a truncated one"),
        (b"not a checkpoint at all" * 20, "not a torch checkpoint, or a truncated one"),  # a bad pickle opcode
        ("truncated", "not a torch checkpoint, or a truncated one"),
        ("foreign objects", "holds objects other than tensors and plain containers"),
        ("directory", "cannot read checkpoint"),
    ],
)
def test_unreadable_checkpoints_never_suggest_weights_only_false(tmp_path, content, message):
    path = tmp_path / "bad.pt"
    if content == "truncated":
        torch.save({"w": torch.zeros(1000)}, path)
        path.write_bytes(path.read_bytes()[:500])
    elif content == "foreign objects":
        torch.save({"args": argparse.Namespace(lr=0.1)}, path)  # a pickled object: loading it runs code
    elif content == "directory":
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        trainer().load_checkpoint(str(path))
    assert message in one_line(e) and "bad.pt" in str(e.value)


def test_someone_elses_file_and_another_models_checkpoint(tmp_path):
    torch.save(torch.nn.Linear(4, 1).state_dict(), tmp_path / "weights.pt")
    with pytest.raises(CheckpointError) as e:
        trainer().load_checkpoint(str(tmp_path / "weights.pt"))
    assert "is not a checkpoint of mpi_sgd's trainer: it has no model, optimizer" in one_line(e)
    path = written(tmp_path, epochs=1)
    with pytest.raises(CheckpointError) as e:
        trainer(model="mlp", epochs=3).load_checkpoint(path)
    assert "was written for another model" in one_line(e) and "--model and --dataset" in str(e.value)


def test_another_optimizers_checkpoint(tmp_path):
    path = written(tmp_path, epochs=1)  # sgd
    with pytest.raises(CheckpointError) as e:
        trainer(optimizer="adam", epochs=3).load_checkpoint(path)
    assert "was written with another --optimizer" in one_line(e)


def test_resuming_a_finished_run_says_so_instead_of_training_nothing(tmp_path):
    path = written(tmp_path, epochs=2)
    with pytest.raises(CheckpointError) as e:
        trainer(epochs=2).load_checkpoint(path)
    assert "is already at epoch 2" in one_line(e) and "nothing is left to train with --epochs 2" in str(e.value)
    resumed = trainer(epochs=3)
    resumed.load_checkpoint(path)  # one more epoch to go: fine
    assert resumed.train()["steps"] == 3 * resumed.steps_per_epoch


def test_checkpoint_read_error_reaches_every_rank_alike(tmp_path):
    # The root reads, and broadcasts the error in place of the contents: with LocalComm that is
    # the same path every rank of a job takes (tests/integration runs it at two ranks).
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        checkpoint.load(str(tmp_path / "missing.pt"), LocalComm())


def test_a_list_of_choices_keeps_order_and_names_what_is_unknown():
    import argparse

    from mpi_sgd.args import choices_list

    parse = choices_list(("raw", "seam", "gloo"), "implementation")
    assert parse("gloo, raw") == ["gloo", "raw"]
    for text, unknown in (("raw,bogus", "bogus"), (",", "','")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"unknown implementation\\(s\\) {unknown}; choose from"):
            parse(text)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"metrics_json": ""}, "--metrics-json needs a file name (leave the flag out to write none)"),
        ({"checkpoint": ""}, "--checkpoint needs a directory (leave the flag out to save none)"),
        ({"metrics_json": "/proc/m.json"}, "--metrics-json '/proc/m.json' cannot be written: no file can be made in"),
        ({"timeline": "{f}/t.json"}, "--timeline '{f}/t.json' cannot be written: '{f}' is a file, not a folder"),
        ({"timeline": "{d}"}, "--timeline '{d}' is a directory; give the name of a file to write"),
        (
            {"metrics_json": "{d}/a.json", "timeline": "{d}/./a.json"},
            "--metrics-json and --timeline name the same file '{d}/a.json'; each needs its own",
        ),
        (
            {"checkpoint": "{d}/ck", "metrics_json": "{d}/ck/latest"},
            "--metrics-json '{d}/ck/latest' is inside what --checkpoint '{d}/ck' saves replace; name a file elsewhere",
        ),
        ({"checkpoint": "{d}/ck", "timeline": "{d}/ck/step-00000005/t.json"}, "is inside what --checkpoint"),
    ],
)
def test_an_output_file_that_cannot_be_written_is_refused_at_start(tmp_path, flags, message):
    # before training, not after an hour of it (the file is written once the run ends)
    (tmp_path / "f").write_text("")
    fill = {"d": str(tmp_path), "f": str(tmp_path / "f")}
    with pytest.raises(ValueError) as e:
        TrainConfig(**{k: v.format(**fill) for k, v in flags.items()})
    assert message.format(**fill) in one_line(e)
    TrainConfig(checkpoint=str(tmp_path / "ck"), metrics_json=str(tmp_path / "ck" / "m.json"))  # beside: fine
    TrainConfig(metrics_json=str(tmp_path / "new" / "deeper" / "m.json"))  # folders made when it writes


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MPI_SGD_STALL_TIMEOUT": "soon"}, "MPI_SGD_STALL_TIMEOUT must be a number of seconds, got 'soon'"),
        ({"MPI_SGD_STALL_TIMEOUT": "-1"}, "MPI_SGD_STALL_TIMEOUT must be 0 or more seconds"),
        ({"MPI_SGD_FAULT": "1:x:nan"}, "MPI_SGD_FAULT must read rank:step:kind"),
        ({"MPI_SGD_FAULT": "7:3:kill"}, "names rank 7, but this job has 2 rank(s) (0-1)"),
        ({"MPI_SGD_SHM_TIMEOUT": "abc"}, "MPI_SGD_SHM_TIMEOUT must be a number of seconds, got 'abc'"),
        ({"MPI_SGD_SHM_TIMEOUT": "-1"}, "MPI_SGD_SHM_TIMEOUT must be above 0 seconds (and finite), got -1.0"),
        ({"MPI_SGD_SHM_TIMEOUT": "inf"}, "MPI_SGD_SHM_TIMEOUT must be above 0 seconds (and finite), got inf"),
        ({"MPI_SGD_SHM_NODE_SIZE": "x"}, "MPI_SGD_SHM_NODE_SIZE must be a whole number of ranks, got 'x'"),
        ({"MPI_SGD_SHM_NODE_SIZE": "0"}, "MPI_SGD_SHM_NODE_SIZE must be at least 1 rank, got 0"),
    ],
)
def test_bad_environment_is_one_line_before_mpi(monkeypatch, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError) as e:
        TrainConfig().check_machine(2)
    assert message in one_line(e)


def test_a_fault_after_the_runs_last_step_is_refused():
    from mpi_sgd.comm import check_fault_step

    check_fault_step(20, {"MPI_SGD_FAULT": "1:20:kill"})  # the last step: it fires
    check_fault_step(20, {})
    with pytest.raises(ValueError, match=r"MPI_SGD_FAULT=1:21:kill is at step 21, but this run ends at step 20"):
        check_fault_step(20, {"MPI_SGD_FAULT": "1:21:kill"})
