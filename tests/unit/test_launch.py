"""Rank discovery from launcher variables: pure logic, no processes."""

import subprocess

import pytest

from mpi_sgd.launch import placement


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (0, 1, 0, 1, "none")),
        ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, (3, 4, 1, 2, "hydra")),
        (
            {
                "OMPI_COMM_WORLD_RANK": "5",
                "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            (5, 8, 1, 4, "openmpi"),
        ),
        (
            {
                "SLURM_PROCID": "4",
                "SLURM_NTASKS": "5",
                "SLURM_LOCALID": "0",
                "SLURM_TASKS_PER_NODE": "2(x2),1",
                "SLURM_NODEID": "2",
            },
            (4, 5, 0, 1, "slurm"),
        ),
        (
            {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"},
            (1, 4, 1, 2, "slurm"),
        ),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, (1, 2, 1, 2, "torchrun")),
    ],
    ids=["none", "hydra", "openmpi", "slurm-tasks-per-node", "slurm-ntasks-per-node", "torchrun"],
)
def test_placement(env, expected):
    p = placement(env)
    assert (p.rank, p.size, p.local_rank, p.local_size, p.launcher) == expected


def test_mpi_launcher_wins_over_enclosing_slurm_step():
    # mpiexec inside an sbatch script: the batch step's SLURM_PROCID=0 is on every rank.
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "PMI_RANK": "2", "PMI_SIZE": "4"}
    assert placement(env).rank == 2 and placement(env).launcher == "hydra"


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("0", False), ("", False), ("off", False)])
def test_env_flag(value, on):
    from mpi_sgd.launch import env_flag

    assert env_flag("X", {"X": value}) is on
    assert env_flag("X", {}) is False


def test_a_rank_that_lost_its_peer_is_told_from_one_that_failed():
    from mpi_sgd.launch import peer_lost

    gloo = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4931"
    assert peer_lost(gloo) == "Connection closed by peer [10.0.0.2]:4931"
    assert peer_lost("Read error [127.0.0.1]:6000: Connection reset by peer") == "Connection reset by peer"
    assert peer_lost("training diverged: the loss is nan") is None


def test_a_launcher_that_failed_before_any_rank_ran_is_told_from_a_failed_job():
    from mpi_sgd.launchers import failed_to_start

    pmix = "-----\nThe PMIx server's listener thread failed to start. We cannot\ncontinue.\n-----\n"
    assert failed_to_start(213, "", pmix)
    assert not failed_to_start(0, "", pmix)  # it ended well after all
    assert not failed_to_start(213, "epoch   0  loss 2.1\n", pmix)  # ranks ran and printed: the job's own end
    assert not failed_to_start(2, "", "sync_sgd.py: error: --lr must be positive\n")  # the job refused, as asked


def test_a_job_whose_launcher_failed_to_start_is_started_once_more(tmp_path, capsys):
    from mpi_sgd.launchers import run_job

    # a stand-in launcher: the PMIx failure on its first start, the job's output on its second
    flag = tmp_path / "started"
    script = (
        f'if [ -e "{flag}" ]; then echo trained; else touch "{flag}"; '
        'echo "The PMIx server\'s listener thread failed to start" >&2; exit 213; fi'
    )
    done = run_job(["bash", "-c", script], "a job", timeout=30)
    assert done.returncode == 0 and done.stdout == "trained\n"
    assert "a job: the launcher failed to start, no rank ran; once more" in capsys.readouterr().err
    refused = run_job(["bash", "-c", "echo 'error: --lr must be positive' >&2; exit 2"], "a job", timeout=30)
    assert refused.returncode == 2 and "once more" not in capsys.readouterr().err  # a job's own failure: once
    flag.unlink()  # the same with both streams in one, as the docs' commands are run
    merged = run_job(["bash", "-c", script], "a job", stderr=subprocess.STDOUT, timeout=30)
    assert merged.returncode == 0 and merged.stdout == "trained\n" and "once more" in capsys.readouterr().err
    refused = run_job(["bash", "-c", "echo 'error: bad' >&2; exit 2"], "a job", stderr=subprocess.STDOUT, timeout=30)
    assert refused.returncode == 2 and refused.stdout == "error: bad\n" and "once more" not in capsys.readouterr().err
