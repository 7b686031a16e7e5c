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
    young = _segment(tmp_path, "mpich_shm_starting_0", 1)  # a job starting now: within the grace
    mapped = _segment(tmp_path, "vader_segment.vm.7.0", 600)
    other = _segment(tmp_path, "not_mpi_at_all", 600)  # another program's file: never touched
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):  # a live job maps its segment
        found = {p.name for p in residue.orphans(str(tmp_path))}
        assert found == {os.path.basename(old), os.path.basename(ompi)}
        removed = residue.clean(str(tmp_path))
    assert sorted(removed) == sorted([(os.path.basename(old), 4096), (os.path.basename(ompi), 4096)])
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
