"""The data API the docs' recipes use, used here as they document it: data.digits(),
data.rank_batches, data.Dataset and data.split, each part of mpi_sgd.data's exports."""

from __future__ import annotations

import pytest
import torch

from mpi_sgd import data

RECIPES_USE = {"Dataset", "digits", "rank_batches", "split", "load", "prepare", "check_size", "global_batches"}


def test_what_the_recipes_import_is_exported():
    assert RECIPES_USE <= set(data.__all__)
    namespace: dict = {}
    exec("from mpi_sgd.data import *", namespace)
    assert RECIPES_USE <= set(namespace)
    for name in data.__all__:
        thing = getattr(data, name)
        assert isinstance(thing, tuple) or (thing.__doc__ and thing.__doc__.strip()), f"{name} has no docstring"


def test_digits_as_documented():
    ds = data.digits()
    assert ds.x.shape == (1797, 1, 8, 8) and ds.x.dtype == torch.float32
    assert 0 <= ds.x.min() and ds.x.max() <= 1
    assert ds.y.dtype == torch.int64 and ds.classification and ds.num_outputs == 10
    assert torch.equal(data.digits().x, ds.x)  # no randomness: every rank builds the same set


@pytest.mark.parametrize("ranks, batch", [(1, 64), (3, 16), (4, 7)])
def test_rank_batches_as_documented(ranks, batch):
    ds = data.digits()
    n = len(ds)
    for epoch in (0, 1):
        shares = [data.rank_batches(n, r, ranks, batch, epoch, seed=0) for r in range(ranks)]
        steps = n // (ranks * batch)
        assert all(s.shape == (steps, batch) for s in shares)
        # Step s of every rank together is the global batch one process draws at batch R*B.
        alone = data.rank_batches(n, 0, 1, ranks * batch, epoch, seed=0)
        assert torch.equal(torch.cat(shares, dim=1), alone)
        assert len(torch.cat(shares, dim=1).unique()) == steps * ranks * batch  # no sample twice in an epoch
        x, y = ds.x[shares[-1][0]], ds.y[shares[-1][0]]  # one rank's batch, as the recipes index it
        assert x.shape == (batch, 1, 8, 8) and y.shape == (batch,)
    other_epoch = data.rank_batches(n, 0, ranks, batch, 1, seed=0)
    assert not torch.equal(data.rank_batches(n, 0, ranks, batch, 0, seed=0), other_epoch)  # reshuffled
    with pytest.raises(ValueError, match="one step needs R\\*B"):
        data.rank_batches(10, 0, ranks, 11, 0, seed=0)


def test_a_users_dataset_split_as_the_trainer_recipe_does():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 10, generator=g)
    train, val = data.split(data.Dataset(x, (x[:, 0] > 0).long(), "mine"), val_fraction=0.1, seed=0)
    assert (len(train), len(val)) == (90, 10) and train.classification
    assert not set(map(tuple, train.x.tolist())) & set(map(tuple, val.x.tolist()))
