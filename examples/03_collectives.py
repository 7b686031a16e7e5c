# mpiexec -n 3 python examples/03_collectives.py
"""Step 3: collectives. Every rank calls the same function; MPI moves the data.

broadcast   root's tensor to everyone          scatter  slot i of root's tensor to rank i
gather      everyone's tensor to root, stacked allgather  the same, to everyone
reduce      elementwise sum on root            allreduce  elementwise sum on everyone

It opens with the classic three-rank sum: ranks hold 1, 2, 3 and after an all-reduce every rank
holds 6 (at other sizes: 1 + 2 + ... + size). Each result is checked against the value
computed here in one process.
"""

from dataclasses import dataclass

import torch

from mpi_sgd.args import ArgumentParser, flag
from mpi_sgd.comm import BACKENDS, init


@dataclass(frozen=True)
class Flags:
    backend: str = flag("mpi4py", "how ranks talk (see 01_hello.py)", choices=BACKENDS)


args = ArgumentParser(description=__doc__).parse_flags(Flags)

comm = init(args.backend)
rank, size = comm.rank, comm.size
lines = []

# allreduce: rank r holds r + 1; everyone ends with the sum.
x = torch.tensor([rank + 1.0])
comm.allreduce(x, op="sum")
assert x.item() == size * (size + 1) / 2
lines.append(f"allreduce  rank {rank} has {x.item():g}")

# broadcast: the root's values overwrite everyone's buffer.
b = torch.tensor([3.0, 1.0, 4.0]) if comm.is_root else torch.zeros(3)
comm.broadcast(b, root=0)
assert b.tolist() == [3.0, 1.0, 4.0]

# scatter: the root holds one row per rank; rank i receives row i.
table = torch.arange(size * 2, dtype=torch.float32).reshape(size, 2) if comm.is_root else None
row = comm.scatter(table, torch.empty(2), root=0)
assert row.tolist() == [2.0 * rank, 2.0 * rank + 1]

# gather: the reverse; rows arrive in rank order on the root only.
squares = comm.gather(torch.tensor([rank**2]), torch.empty(size, 1, dtype=torch.int64) if comm.is_root else None)
if comm.is_root:
    assert squares.flatten().tolist() == [r**2 for r in range(size)]

# reduce: like allreduce, but only the root gets the result (others keep a scratch value).
m = comm.reduce(torch.tensor([float(rank)]), op="max", root=0)
if comm.is_root:
    assert m.item() == size - 1

# allgather: every rank gets every rank's contribution.
ranks = comm.allgather(torch.tensor([rank]), torch.empty(size, 1, dtype=torch.int64))
assert ranks.flatten().tolist() == list(range(size))

report = comm.gather_obj(lines[0])
if comm.is_root:
    print("\n".join(report))
    print(f"broadcast  everyone has {b.tolist()}")
    print(f"scatter    rank 0 got row {row.tolist()}")
    print(f"gather     root has squares {squares.flatten().tolist()}")
    print(f"reduce     root has max rank {m.item():g}")
    print(f"allgather  everyone has ranks {ranks.flatten().tolist()}")
    print("all collectives agree with the one-process reference")
