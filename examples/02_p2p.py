# mpiexec -n 4 python examples/02_p2p.py
"""Step 2: point-to-point messages. Blocking send/recv, non-blocking isend/irecv, a token ring.

Every message names its peer and a tag; buffers are torch tensors that MPI reads and writes in
place. Works at any world size, 1 included (a rank may message itself without blocking).
"""

from dataclasses import dataclass

import torch

from mpi_sgd.args import ArgumentParser, flag, positive_int
from mpi_sgd.comm import BACKENDS, init


@dataclass(frozen=True)
class Flags:  # step 1's, and how long the messages are
    backend: str = flag("mpi4py", "how ranks talk (see 01_hello.py)", choices=BACKENDS)
    length: int = flag(4, "elements per message", positive_int)


args = ArgumentParser(description=__doc__).parse_flags(Flags)

comm = init(args.backend)
rank, size = comm.rank, comm.size
right, left = (rank + 1) % size, (rank - 1) % size

# 1. Blocking: the root sends each rank its own tensor; recv returns once the data is there.
#    A blocking send to oneself may wait forever for a receive that comes after it, so the
#    root keeps its own share instead.
if comm.is_root:
    for dest in range(1, size):
        comm.send(torch.full((args.length,), float(dest)), dest, tag=1)
    mine = torch.zeros(args.length)
else:
    mine = comm.recv(torch.empty(args.length), source=0, tag=1)
assert torch.all(mine == rank), f"rank {rank} received {mine}"

# 2. Non-blocking: post the receive from the left and the send to the right, then wait on both.
#    Since nobody blocks before everything is posted, the ring of exchanges cannot deadlock.
outgoing = torch.arange(args.length, dtype=torch.float64) + 100 * rank
incoming = torch.empty_like(outgoing)
requests = [comm.irecv(incoming, left, tag=2), comm.isend(outgoing, right, tag=2)]
for r in requests:
    r.wait()
assert torch.equal(incoming, torch.arange(args.length, dtype=torch.float64) + 100 * left)

# 3. A token passed once around the ring; each rank adds its rank. The root starts it with a
#    non-blocking send (so a world of one can pass the token to itself) and receives it last.
token = torch.zeros(1, dtype=torch.int64)
if comm.is_root:
    sent = comm.isend(token.clone(), right, tag=3)
    comm.recv(token, left, tag=3)
    sent.wait()
else:
    comm.recv(token, left, tag=3)
    token += rank
    comm.send(token, right, tag=3)

report = comm.gather_obj(
    f"rank {rank}: got {mine[0].item():g} from root, {incoming[0].item():g} from left neighbour {left}"
)
if comm.is_root:
    print("\n".join(report))
    expected = size * (size - 1) // 2
    print(f"token after one lap: {token.item()} (expected 0+1+...+{size - 1} = {expected})")
    assert token.item() == expected
