"""The digits' cache file (mpi_sgd.datacache): the same arrays as scikit-learn's, read back without
importing scikit-learn, and only ever a copy (a bad or unwritable cache falls back to scikit-learn)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from mpi_sgd import data, datacache

pytest.importorskip("sklearn", reason="the digits need scikit-learn (pip install 'mpi-sgd[digits]')")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MPI_SGD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def reference() -> data.Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return data.Dataset(
        torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1),
        torch.from_numpy(bunch.target.astype(np.int64)),
        "digits",
    )


def test_first_load_writes_the_cache_and_both_equal_scikit_learn_bit_for_bit(cache):
    expected = reference()
    first = data.digits()
    (path,) = cache.iterdir()
    assert path.name.startswith("digits-scikit-learn-") and path.suffix == ".npz"
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    again = data.digits()  # from the file
    for ds in (first, again):
        assert torch.equal(ds.x, expected.x) and torch.equal(ds.y, expected.y)
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left behind


def test_a_warm_cache_is_read_without_importing_scikit_learn(cache):
    data.digits()
    code = "import sys\nfrom mpi_sgd import data\ndata.digits()\nprint('sklearn' in sys.modules)"
    env = {**os.environ, "MPI_SGD_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["False"], out.stderr


@pytest.mark.parametrize(
    "damage",
    [b"", b"not a zip file at all", "truncated", "wrong shape"],
    ids=["empty", "garbage", "truncated", "wrong shape"],
)
def test_a_damaged_cache_is_ignored_and_written_afresh(cache, damage):
    data.digits()
    (path,) = cache.iterdir()
    if damage == "truncated":
        damage = path.read_bytes()[:1000]
    elif damage == "wrong shape":
        with open(path, "wb") as f:
            np.savez(f, images=np.zeros((5, 8, 8), np.uint8), labels=np.zeros(5, np.int64))
        damage = path.read_bytes()
    path.write_bytes(damage)
    ds = data.digits()
    expected = reference()
    assert torch.equal(ds.x, expected.x) and torch.equal(ds.y, expected.y)
    assert datacache._read(str(path)) is not None  # rewritten whole


def test_a_cache_directory_that_cannot_be_written_costs_only_the_speed(tmp_path, monkeypatch):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("MPI_SGD_CACHE", str(blocker / "cache"))  # under a file: never creatable, even as root
    ds = data.digits()
    assert torch.equal(ds.y, reference().y)
    assert list(tmp_path.iterdir()) == [blocker]


def test_without_scikit_learn_it_is_an_import_error(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(ImportError):
        datacache.digits_path()


def test_without_a_home_there_is_no_cache_and_nothing_is_written(tmp_path, monkeypatch):
    for name in ("MPI_SGD_CACHE", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # as without HOME and a passwd entry
    monkeypatch.chdir(tmp_path)
    assert datacache.cache_dir() is None and datacache.digits_path() is None
    assert torch.equal(data.digits().y, reference().y)
    assert list(tmp_path.iterdir()) == []  # no directory named "~" in the working directory
