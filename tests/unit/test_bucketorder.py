"""The bucket scheduler alone, with no processes: buckets start in index order, whatever order
their gradients arrive in, and a gradient for a bucket already sent is an error, not a wrong sum."""

from __future__ import annotations

import pytest

from mpi_sgd.bucketorder import BucketOrder, SentTwice


def scheduler(sizes):
    started = []
    return BucketOrder(sizes, started.append), started


def test_a_ready_bucket_waits_for_its_predecessors():
    order, started = scheduler([2, 1, 1])
    assert order.arrive(2) and started == []  # bucket 2 is complete, but 0 and 1 have not started
    order.start_ready()
    assert started == []
    assert not order.arrive(0)  # one of bucket 0's two gradients
    order.start_ready()
    assert started == []
    assert order.arrive(0)
    order.start_ready()
    assert started == [0]  # 1 is still incomplete, so 2 waits behind it
    assert order.arrive(1)
    order.start_ready()
    assert started == [0, 1, 2] and list(order.started) == [0, 1, 2]


def test_flush_starts_the_rest_in_order_and_reset_begins_a_new_round():
    order, started = scheduler([1, 3, 1])
    order.arrive(0)
    order.start_ready()
    order.flush()  # bucket 1 got none of its gradients (parameters unused this step): it still starts
    assert started == [0, 1, 2]
    order.reset()
    assert list(order.started) == [] and order.pending == [1, 3, 1]
    order.arrive(0)
    order.start_ready()
    assert started == [0, 1, 2, 0]


def test_a_gradient_for_a_started_bucket_raises():
    order, started = scheduler([1, 1])
    order.arrive(0)
    order.start_ready()
    with pytest.raises(SentTwice, match="bucket 0"):
        order.arrive(0)  # a second backward in the same round: its collective already went out
    assert started == [0]
