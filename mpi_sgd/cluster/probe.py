"""What one host would bring to an MPI job, printed as one JSON line.

``mpi-sgd doctor`` pipes this file into ``python -`` on each host over ssh, so it uses the
standard library only and imports nothing from mpi_sgd (which the host may lack: that is one of
the things the doctor reports). Arguments: the names this host must reach (every host of the
job and the launcher, whose name hydra's proxies connect back to).

    python probe.py a b
"""

import json
import os
import platform
import re
import socket
import subprocess
import sys


def mpi_library():
    """MPI as mpi4py sees it, without starting MPI: 'MPICH 5.0.2 (ABI 18:2:6)' or 'Open MPI v5.0.11'."""
    import mpi4py

    mpi4py.rc.initialize = False  # MPI_Get_library_version may be called before MPI_Init
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    text = MPI.Get_library_version()
    if m := re.search(r"MPICH Version:\s*(\S+)", text):
        abi = re.search(r"MPICH ABI:\s*(\S+)", text)
        return f"MPICH {m[1]}" + (f" (ABI {abi[1]})" if abi else ""), mpi4py.__version__
    first = text.strip().splitlines()[0] if text.strip() else "unknown MPI"
    return first.split(",")[0].strip(), mpi4py.__version__


def resolve(name):
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def route(address):
    """The interface this host would use to reach ``address``: 'eth0', 'lo', 'docker0', ..."""
    try:
        out = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True, timeout=3).stdout
        if m := re.search(r"\bdev (\S+)", out):
            return m[1]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "?"


def main(names):
    facts = {"hostname": socket.gethostname(), "python": platform.python_version(), "executable": sys.executable}
    try:
        facts["mpi"], facts["mpi4py"] = mpi_library()
    except Exception as e:  # missing, or built for an MPI this host lacks
        facts["mpi"], facts["mpi4py"], facts["mpi_error"] = None, None, f"{type(e).__name__}: {e}"
    # Installed versions from package metadata: importing torch takes seconds on a busy host.
    from importlib.metadata import PackageNotFoundError, version

    for key, dist in (("torch", "torch"), ("mpi_sgd", "mpi-sgd")):
        try:
            facts[key] = version(dist)
        except PackageNotFoundError:
            facts[key] = None
    try:
        st = os.statvfs("/dev/shm")
        facts["shm_bytes"] = st.f_blocks * st.f_frsize
    except OSError:
        facts["shm_bytes"] = 0
    peers = {}
    for name in names:
        address = resolve(name)
        peers[name] = {"address": address, "dev": route(address) if address else None}
    facts["peers"] = peers
    print(json.dumps(facts))


if __name__ == "__main__":
    main(sys.argv[1:])
