"""What killed jobs leave in /dev/shm: found by name, owner, age and whether any process maps it."""

from __future__ import annotations

import mmap
import os
import time

from mpi_sgd.cluster import residue


def _segment(directory, name: str, age: float) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_orphans_are_the_old_unmapped_mpi_segments_only(tmp_path):
    old = _segment(tmp_path, "mpich_shm_dead_0", 600)
    ompi = _segment(tmp_path, "sm_segment.vm.0.1c920000.0", 600)
    impi = _segment(tmp_path, "Intel_MPI_yAuBmO", 600)  # left by a job killed inside MPI_Win_allocate_shared
    mpich4 = _segment(tmp_path, "mpich_shar_tmpXk2l9Q", 600)  # MPICH 4.0's name for its segment
    young = _segment(tmp_path, "mpich_shm_starting_0", 1)  # a job starting now: within the grace
    mapped = _segment(tmp_path, "vader_segment.vm.7.0", 600)
    other = _segment(tmp_path, "not_mpi_at_all", 600)  # another program's file: never touched
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):  # a live job maps its segment
        found = {p.name for p in residue.orphans(str(tmp_path))}
        assert found == {os.path.basename(p) for p in (old, ompi, impi, mpich4)}
        removed = residue.clean(str(tmp_path))
    assert sorted(removed) == sorted((os.path.basename(p), 4096) for p in (old, ompi, impi, mpich4))
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in (young, mapped, other))
    # unmapped now (its job ended), and with no grace the young one counts too; never the other program's
    assert {p.name for p in residue.orphans(str(tmp_path), grace=0)} == {
        os.path.basename(young),
        os.path.basename(mapped),
    }


def test_no_candidates_means_proc_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(residue, "mapped_inodes", lambda *a: (_ for _ in ()).throw(AssertionError("read /proc")))
    _segment(tmp_path, "mpich_shm_young_0", 1)
    assert residue.orphans(str(tmp_path)) == []
    assert residue.segments(str(tmp_path / "missing")) == []


BOOT = 1_700_000_000  # the fake machine's boot time


def _fake_proc(root, pid: int, started: float) -> None:
    """/proc/PID/stat of a process that started at ``started`` (field 22: clock ticks since boot)."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  1 2 3\nbtime {BOOT}\n")
    os.makedirs(root / str(pid))
    ticks = round((started - BOOT) * os.sysconf("SC_CLK_TCK"))
    (root / str(pid) / "stat").write_text(f"{pid} (a name (with) spaces) S" + " 0" * 18 + f" {ticks} 0 0\n")


def _session(tmp, name: str, changed: float) -> None:
    os.makedirs(tmp / name / "0")
    os.utime(tmp / name, (changed, changed))


def test_stale_sessions_are_those_whose_launcher_is_gone(tmp_path):
    # Open MPI's launcher keeps TMPDIR/ompi.PID; a later launcher given the same pid cannot start.
    tmp, proc, t = tmp_path / "tmp", tmp_path / "proc", BOOT + 1000.0
    _session(tmp, "ompi.101", t + 0.5)  # made by the process that has pid 101 now: a running job
    _session(tmp, "ompi.102", t + 1.5)  # within the slack of the boot time's whole seconds: kept
    _session(tmp, "ompi.103", t - 600)  # the launcher died; its pid went to a process started later
    _session(tmp, "ompi.104", t)  # no process has pid 104
    _session(tmp, "ompi.vm.0", t)  # Open MPI's per-user directory, not a launcher's session
    (tmp / "ompi.105").write_text("a file, not a session")
    _fake_proc(proc, 101, t)
    _fake_proc(proc, 102, t + 3)
    _fake_proc(proc, 103, t)
    assert sorted(p.name for p in residue.stale_sessions(str(tmp), str(proc))) == ["ompi.103", "ompi.104"]


def test_clean_sessions_removes_a_dead_launchers_directory_with_its_contents(tmp_path):
    dead = tmp_path / f"ompi.{2**31 - 1}"  # above any pid_max: no process has this pid
    os.makedirs(dead / "1")
    (dead / "hwloc.sm").write_bytes(b"\0" * 64)
    (tmp_path / "other").mkdir()  # anything else in the temporary directory is left alone
    assert residue.clean_sessions(str(tmp_path)) == [str(dead)]
    assert os.listdir(tmp_path) == ["other"]
