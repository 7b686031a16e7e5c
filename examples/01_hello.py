# mpiexec -n 4 python examples/01_hello.py
"""Step 1: every process of an MPI job runs this same file. Who am I, how many are we, where?

MPI numbers the processes of a job 0..size-1 (the rank). Processes that share a host also get
a local rank, which later picks the GPU a rank drives. Rank 0, the root, collects everyone's
answer and prints them in order, so the output does not interleave.
"""

import os
import socket
from dataclasses import dataclass

from mpi_sgd.args import ArgumentParser, flag
from mpi_sgd.comm import BACKENDS, init


@dataclass(frozen=True)
class Flags:
    backend: str = flag("mpi4py", "how ranks talk: mpi4py, local (no MPI) or torch.distributed's", choices=BACKENDS)


args = ArgumentParser(description=__doc__).parse_flags(Flags)

comm = init(args.backend)

# Every rank describes itself; gather_obj brings the descriptions to the root.
me = dict(
    rank=comm.rank, host=socket.gethostname(), local_rank=comm.local_rank, local_size=comm.local_size, pid=os.getpid()
)
everyone = comm.gather_obj(me)

if comm.is_root:
    hosts = sorted({p["host"] for p in everyone})
    print(f"{comm.size} rank(s) on {len(hosts)} host(s), backend {comm.backend}")
    for p in everyone:
        print(
            f"hello from rank {p['rank']} of {comm.size} on {p['host']} "
            f"(local rank {p['local_rank']} of {p['local_size']}, pid {p['pid']})"
        )
