"""Calibration under mpiexec at tiny sizes: every rank measures, every rank ends with the same fit."""

import pytest

from mpi_sgd.calibrate import calibrate, fit_network, measure_allreduce


@pytest.fixture(scope="module")
def comm():
    from mpi_sgd.comm import init

    return init("mpi4py", abort_on_error=False)


@pytest.mark.mpi
def test_sweep_agrees_across_ranks(comm):
    points = measure_allreduce(comm, [4, 1024, 65536], rounds=2)
    assert [p.nbytes for p in points] == [4, 1024, 65536]
    assert all(p.ranks == comm.size and 0 <= p.min_s <= p.avg_s <= p.max_s for p in points)
    # min/avg/max come from an allgather: every rank holds the same figures.
    assert comm.allgather_obj(points) == [points] * comm.size


@pytest.mark.mpi(min_size=2)
def test_fit_from_a_real_sweep(comm):
    points = measure_allreduce(comm, [4, 256, 16384, 262144], rounds=2)
    net = fit_network(points, gamma=0.0)
    assert net.alpha >= 0 and net.beta > 0
    # A loose sanity band, not a benchmark: the machine is shared and noisy.
    assert net.beta < 1e-6  # faster than 1 MB/s


@pytest.mark.mpi
def test_calibrate_is_collective_and_consistent(comm):
    cal = calibrate(comm, sizes=[4, 4096], layers=(8, 16, 4), batch=4)
    assert cal.step.params == 8 * 16 + 16 + 16 * 4 + 4
    assert len(cal.sweep) == (2 if comm.size > 1 else 0)
    mine = (cal.network, cal.step.seconds)
    assert comm.allgather_obj(mine) == [mine] * comm.size
