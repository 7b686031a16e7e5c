"""Whole-job behaviour: a failing rank ends the job naming itself; the benchmark CLI runs."""

from __future__ import annotations

import json
import math
import re
import time

import pytest

from .conftest import own_lines, run_mpi, table_header, widest_line


@pytest.mark.parametrize("torch_after", [False, True], ids=["mpi4py", "gloo-made-after"])
def test_a_failing_rank_aborts_the_job_quickly(tmp_path, torch_after):
    # A torch.distributed group made after init() (as the benchmarks' comparisons make theirs) wraps
    # the abort hook in torch's own, which points sys.stderr at a buffer it would print only after
    # the hook returns, and the hook ends the process first: the report must reach the real stderr.
    script = tmp_path / "fail.py"
    after = "from mpi_sgd.comm.backends.torch_dist import TorchDistComm\nTorchDistComm('gloo', comm)\n"
    script.write_text(
        "from mpi_sgd.comm import init\n"
        "comm = init()\n" + (after if torch_after else "") + "if comm.rank == 1:\n"
        "    raise ValueError('bad shard on purpose')\n"
        "comm.barrier()  # the other ranks would wait here forever without the abort hook\n"
    )
    start = time.monotonic()
    proc = run_mpi(3, str(script), check=False, timeout=60)
    assert proc.returncode != 0
    assert time.monotonic() - start < 30  # bounded by start-up, not by MPIEXEC_TIMEOUT
    assert "rank 1 of 3" in proc.stderr and "ValueError: bad shard on purpose" in proc.stderr


def test_bench_allreduce_prints_side_by_side_and_writes_json(tmp_path):
    proc = run_mpi(
        2,
        "-m",
        "mpi_sgd.cli",
        "bench",
        "allreduce",
        "--min-bytes",
        "1KiB",
        "--max-bytes",
        "64KiB",
        "--iterations",
        "20",
        "--rounds",
        "2",
        "--out-dir",
        str(tmp_path),
        "--detail",
    )
    out = proc.stdout
    headers = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]
    headers = [h for h in headers if h[0] == "size"]  # one per table: times, then what they say, then --detail's
    assert headers[0] == ["size", "raw", "seam", "seam-checked", "ring", "gloo"]
    assert headers[1] == ["size", "raw/seam time", "seam-raw us", "check cost %", "busbw GB/s (raw)", "#wrong"]
    assert widest_line(out) <= 120
    assert re.search(r"\|\s+1 KiB \|", out) and re.search(r"\|\s+64 KiB \|", out)
    assert "seam per-call overhead below 64 KiB" in out and "## gloo" in out
    assert re.search(r"^per-call argument check at 4 KiB: [\d.]+x \[\d+% CI .*\(project target <= 1.05x: ", out, re.M)
    data = json.loads((tmp_path / "allreduce-n2.json").read_text())
    assert data["ranks"] == 2 and {r["impl"] for r in data["rows"]} == {"raw", "seam", "seam-checked", "ring", "gloo"}
    assert {r["bytes"] for r in data["rows"]} == {1024 << k for k in range(7)}
    assert all(r["min_s"] <= r["avg_s"] <= r["max_s"] for r in data["rows"])
    assert all(r["wrong"] == 0 for r in data["rows"])  # every implementation summed exactly, every size
    assert (tmp_path / "allreduce-n2.png").stat().st_size > 1000


def test_bench_rejects_bad_sizes():
    proc = run_mpi(2, "-m", "mpi_sgd.cli", "bench", "allreduce", "--max-bytes", "lots", check=False, timeout=60)
    assert proc.returncode == 2 and "not a size: 'lots'" in proc.stderr


def test_bench_sgd_on_a_gpu_it_lacks_is_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: make test-gpu runs the GPU benchmarks' code")
    proc = run_mpi(
        1, "-m", "mpi_sgd.cli", "bench", "sgd", "--device", "cuda", "--backend", "nccl", check=False, timeout=60
    )
    lines = own_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("mpi-sgd bench sgd: error: --device cuda: ") and "--device cpu" in lines[0]


def test_bench_sgd_prints_ddp_bench_columns_and_sweeps_buckets(tmp_path):
    proc = run_mpi(
        2,
        "-m",
        "mpi_sgd.cli",
        "bench",
        "sgd",
        "--models",
        "simplenet",
        "--steps-per-round",
        "3",
        "--rounds",
        "2",
        "--warmup",
        "1",
        "--bucket-mb",
        "0.5,2",
        "--backend",  # the strategies over torch.distributed's "mpi4py" group, beside DDP on it and gloo
        "torch-mpi4py",
        "--out-dir",
        str(tmp_path),
    )
    assert widest_line(proc.stdout) <= 120
    assert table_header(proc.stdout) == [
        "model",
        "variant",
        "step ms",
        "± std",
        "comm ms",
        "± std",
        "comm frac",
        "x DDP-gloo",
        "x local",
        "exposed ms",
    ]
    payload = json.loads((tmp_path / "sgd-n2.json").read_text())
    assert (payload["backend"], payload["device"]) == ("torch-mpi4py", "cpu")
    rows = payload["rows"]
    names = [r["variant"] for r in rows]
    assert names == [
        "local",
        "naive",
        "flat",
        "bucketed 0.5MB",
        "bucketed 2MB",
        "bucketed-mpi 0.5MB",
        "bucketed-mpi 2MB",
        "ddp-gloo",
        "ddp-mpi4py",
        "comm-only",
    ]
    by_name = {r["variant"]: r for r in rows}
    assert by_name["ddp-mpi4py"]["exposed_s"] == by_name["ddp-mpi4py"]["step_s"] - by_name["local"]["step_s"]
    for r in rows:
        if r["variant"] in ("naive", "flat", "bucketed 0.5MB", "bucketed-mpi 0.5MB"):
            # blocked time is part of the step, never more than all of it
            assert 0 <= r["comm_s"] and 0 <= r["comm_frac"] <= 1 and r["step_std_s"] >= 0
    assert (tmp_path / "sgd-n2.png").stat().st_size > 1000


def test_bench_ddp_splits_the_step_and_writes_one_steps_timeline(tmp_path):
    """At an odd world size, with the bucket-view variant: a table per variant, the parts in the
    JSON, and one step's trace with every rank's forward, backward, update and buckets."""
    proc = run_mpi(
        3,
        "-m",
        "mpi_sgd.cli",
        "bench",
        "ddp",
        "--models",
        "simplenet",
        "--rounds",
        "2",
        "--steps-per-round",
        "2",
        "--warmup",
        "1",
        "--bucket-view",
        "--out-dir",
        str(tmp_path),
    )
    assert "where DDP's step goes, simplenet:" in proc.stdout
    assert "simplenet, ddp-view (gradient_as_bucket_view=True)" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines() if str(tmp_path) not in line) <= 120
    (model,) = json.loads((tmp_path / "ddp-n3.json").read_text())["models"]
    for variant in ("ddp", "ddp-view"):
        parts = model["parts"][variant]
        assert parts["buckets"] >= 1 and parts["step"] > 0 and parts["local_step"] > 0
        assert all(math.isfinite(parts[k]) for k in ("forward", "to_last_bucket", "after_last_start", "after_mpi"))
    trace = json.loads((tmp_path / "ddp-step-simplenet-n3.json").read_text())["traceEvents"]
    assert {e["tid"] for e in trace} == {0, 1, 2}
    for rank in range(3):
        names = {e["name"] for e in trace if e["tid"] == rank}
        assert {"forward", "backward", "optimizer", "bucket 0: all-reduce (MPI)"} <= names


def test_run_job_raises_with_the_jobs_output():
    import pytest

    from mpi_sgd.launch import JobFailed, run_job

    run_job(2, "-c", "print('fine')")
    with pytest.raises(JobFailed, match="exit 3") as err:
        run_job(1, "-c", "import sys; print('said why'); sys.exit(3)")
    assert err.value.returncode == 3 and "said why" in str(err.value)
