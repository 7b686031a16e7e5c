"""Resuming at another global batch (world size or batch per rank): where the interrupted epoch
goes on, and the one line that says so. The trainer's arithmetic itself is checked against one
process in tests/mpi/test_sync_sgd.py."""

from __future__ import annotations

import torch

from mpi_sgd import data
from mpi_sgd.checkpoint import Progress
from mpi_sgd.resumption import carry_on, resize_notice


def test_the_same_global_batch_goes_on_unchanged():
    at = Progress(2, 3, 40, 0, 4, 16)
    assert carry_on(at, 1000, 4, 16) is at


def test_another_world_size_goes_on_from_the_first_untrained_sample():
    at = Progress(1, 5, 20, 0, 2, 64)  # 5 steps of 128 samples into epoch 1
    now = carry_on(at, 1000, 3, 64)
    assert (now.epoch, now.step_in_epoch, now.step, now.offset) == (1, 0, 20, 640)
    assert now.samples_in_epoch == 640
    line = resize_notice(at, now, 1000, 3, 64)
    assert line == (
        "resuming at a global batch of 192 (3 ranks x 64) from a checkpoint made at 128 (2 x 64); "
        "epoch 1 goes on from sample 640 of 1000"
    )
    # a second resize inside the same epoch counts from where the first one began
    again = carry_on(Progress(1, 1, 21, 640, 3, 64), 1000, 2, 64)
    assert again.offset == 640 + 192


def test_less_than_a_global_batch_left_starts_the_next_epoch():
    at = Progress(0, 7, 7, 0, 2, 64)  # 896 of 1000 trained; 104 < 3 x 64
    now = carry_on(at, 1000, 3, 64)
    assert (now.epoch, now.step_in_epoch, now.offset) == (1, 0, 0)
    assert resize_notice(at, now, 1000, 3, 64).endswith(
        "epoch 0 had 104 of 1000 samples left, fewer than one global batch: epoch 1 starts"
    )


def test_at_an_epoch_boundary_nothing_is_skipped():
    now = carry_on(Progress(3, 0, 30, 0, 4, 8), 1000, 1, 8)
    assert (now.epoch, now.offset) == (3, 0)
    assert resize_notice(Progress(3, 0, 30, 0, 4, 8), now, 1000, 1, 8).endswith("; epoch 3 starts afresh")


def test_an_offset_epoch_is_the_rest_of_the_same_permutation():
    whole = data.global_batches(1000, 2, 64, 5, 0).reshape(-1)  # 7 steps: 896 samples
    rest = data.global_batches(1000, 3, 64, 5, 0, offset=640)  # (1000 - 640) // 192 = 1 step
    assert rest.shape == (1, 3, 64)
    everything = torch.randperm(1000, generator=torch.Generator().manual_seed(5))
    assert torch.equal(whole, everything[:896])
    assert torch.equal(rest.reshape(-1), everything[640:832])
    assert data.global_batches(1000, 3, 64, 5, 0, offset=900).shape == (0, 3, 64)
