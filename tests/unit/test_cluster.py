"""Hostfiles, the Slurm guard and the doctor's judgement, without any host or process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_sgd.checkpoint import store
from mpi_sgd.cluster.doctor import SHM_MIN, HostReport, compare, first_problem, table
from mpi_sgd.cluster.hosts import Host, parse_hostfile, parse_hosts_option, read_hostfile, unique_names
from mpi_sgd.launch import check_world

HOSTFILES = Path(__file__).resolve().parents[2] / "hostfiles"


def test_hosts_option_as_hydra_reads_it():
    assert parse_hosts_option("a,b") == [Host("a"), Host("b")]
    assert parse_hosts_option("a:2, b:3") == [Host("a", 2), Host("b", 3)]
    for bad in ("a,,b", "a:x", "a:0"):
        with pytest.raises(ValueError):
            parse_hosts_option(bad)


def test_hostfile_formats():
    assert parse_hostfile("# c\nx:2\n\ny  # one slot\n") == [Host("x", 2), Host("y", 1)]
    assert parse_hostfile("x slots=4 max_slots=8\ny slots=2\n") == [Host("x", 4), Host("y", 2)]
    with pytest.raises(ValueError, match="no hosts"):
        parse_hostfile("# only a comment\n")
    with pytest.raises(ValueError, match="f:2"):
        parse_hostfile("x:2\nx::\n", "f")


@pytest.mark.parametrize(
    "name, hosts",
    [
        ("localhost", [Host("localhost", 4)]),
        ("hydra", [Host("a", 2), Host("b", 2)]),
        ("hydra-round-robin", [Host("a"), Host("b")]),
        ("openmpi", [Host("a", 2), Host("b", 2)]),
    ],
)
def test_shipped_hostfiles_open_with_a_comment_and_parse(name, hosts):
    path = HOSTFILES / name
    assert path.read_text().startswith("# "), f"{name} must open with a comment explaining its format"
    assert read_hostfile(path) == hosts


def test_slurm_script_is_valid_bash_with_the_guard():
    script = HOSTFILES / "slurm.sbatch"
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n# ") and "#SBATCH --nodes=2" in text
    assert "srun --mpi=" in text and "mpiexec -n" in text and "MPI sees a world of" in text
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_unique_names_keep_order():
    assert unique_names([Host("b"), Host("a", 2), Host("b", 3)]) == ["b", "a"]


def test_slurm_singletons_are_stopped(capsys):
    with pytest.raises(SystemExit) as stop:
        check_world(1, {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2"})
    assert stop.value.code == 2 and "Slurm started 4 tasks" in capsys.readouterr().err
    check_world(4, {"SLURM_STEP_NUM_TASKS": "4"})  # srun with PMI: the world is whole
    check_world(1, {"SLURM_STEP_NUM_TASKS": "1"})  # one task is one task
    check_world(1, {})  # no Slurm at all


def _facts(**changes) -> dict:
    facts = {
        "hostname": "h",
        "python": "3.11.7",
        "mpi4py": "4.1.2",
        "mpi": "MPICH 5.0.2 (ABI 18:2:6)",
        "torch": "2.13.0+cpu",
        "mpi_sgd": "0.1.0",
        "shm_bytes": 1 << 30,
        "peers": {"a": {"address": "10.0.0.1", "dev": "eth0"}, "b": {"address": "10.0.0.2", "dev": "eth0"}},
    }
    return facts | changes


def _judge(facts_by_host: dict[str, dict]) -> list[HostReport]:
    launcher = HostReport("a (launcher)", facts=_facts(hostname="a"))
    reports = [HostReport(name, address="10.0.0.9", ssh="ok", facts=f) for name, f in facts_by_host.items()]
    compare(reports, launcher)
    return reports


def test_doctor_accepts_matching_hosts():
    reports = _judge({"a": _facts(hostname="a"), "b": _facts(hostname="b")})
    assert first_problem(reports) is None
    assert [line.split()[-1] for line in table(reports).splitlines()] == ["status", "ok", "ok"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mpi": "Open MPI v5.0.11"}, "a mix of MPIs: b runs Open MPI, the launcher MPICH"),
        ({"mpi": "Intel(R) MPI Library 2021.19 for Linux* OS"}, "b runs Intel MPI, the launcher MPICH"),
        ({"mpi": "MPICH 4.0.2"}, "b has MPI library MPICH 4.0.2, the launcher MPICH"),
        ({"torch": "2.5.1"}, "b has torch 2.5.1"),
        ({"shm_bytes": 64 << 20}, "/dev/shm is 64 MiB"),
        ({"peers": {"a": {"address": "127.0.1.1", "dev": "lo"}}}, "b resolves a to 127.0.1.1 (loopback)"),
        ({"peers": {"a": {"address": "172.17.0.1", "dev": "docker0"}}}, "through docker0"),
        ({"peers": {"a": {"address": None, "dev": None}}}, "b cannot resolve a"),
    ],
)
def test_doctor_names_what_to_fix(change, message):
    reports = _judge({"a": _facts(hostname="a"), "b": _facts(hostname="b", **change)})
    assert message in first_problem(reports)
    assert table(reports).splitlines()[2].split()[-1] == "FIX"


def test_doctor_reports_the_most_basic_problem_first():
    """A host that cannot be reached comes before another host's small /dev/shm."""
    reports = _judge({"a": _facts(hostname="a", shm_bytes=SHM_MIN // 2), "b": _facts(hostname="b")})
    reports[1].facts = None
    reports[1].problem("ssh", "ssh to b failed: Connection refused")
    assert first_problem(reports) == "ssh to b failed: Connection refused"


def test_jobs_started_from_a_job_keep_the_users_launcher_settings(monkeypatch):
    """A new job drops the enclosing job's variables but keeps how to reach the hosts."""
    from mpi_sgd.launch import mpiexec_command

    monkeypatch.setenv("HYDRA_LAUNCHER_EXEC", "/cluster/ssh")
    monkeypatch.setenv("HYDRA_IFACE", "eth1")
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("HYDRA_CONTROL_FD", "7")
    _, env = mpiexec_command(2, "x.py")
    assert env["HYDRA_LAUNCHER_EXEC"] == "/cluster/ssh" and env["HYDRA_IFACE"] == "eth1"
    assert "PMI_RANK" not in env and "HYDRA_CONTROL_FD" not in env


def test_slurm_script_saves_on_its_signal_and_requeues(tmp_path):
    # The batch script as Slurm runs it, with srun and scontrol stood in for: srun starts the one
    # task itself; the script gets SIGUSR1 (Slurm's --signal=B:USR1) once training runs, must pass it
    # on, see the job exit 75 with its step saved, and requeue the job.
    root = HOSTFILES.parent
    (tmp_path / ".venv").symlink_to(sys.prefix)  # the script sources .venv: this test's own venv (any MPI's)
    (tmp_path / "examples").symlink_to(root / "examples")
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nshift\nexec "$@"\n')  # drop --mpi=..., run the one task
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/scontrol\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_", "HYDRA_"))}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        SLURM_SUBMIT_DIR=str(tmp_path),
        SLURM_NTASKS="1",
        SLURM_JOB_NAME="job",
        SLURM_JOB_ID="42",
        OMP_NUM_THREADS="1",
    )
    job = subprocess.Popen(
        ["bash", str(HOSTFILES / "slurm.sbatch")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for line in job.stdout:
        if line.startswith("epoch   0"):
            break
    job.send_signal(signal.SIGUSR1)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 75, (job.returncode, out[-2000:], err[-2000:])
    assert re.search(r"^saved step \d+ to checkpoints/job on SIGTERM; resume with --resume auto$", out, re.M), out
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", "42"]
    assert store.checkpoints(str(tmp_path / "checkpoints" / "job"))
