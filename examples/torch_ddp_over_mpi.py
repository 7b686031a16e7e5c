# mpiexec -n 2 python examples/torch_ddp_over_mpi.py
"""Beside step 6: torch's own DistributedDataParallel, over MPI, from a pip-installed torch.

This is the DDP recipe of the PyTorch tutorials (DistributedSampler, DDP, set_epoch, logging on
rank 0) with one change: the backend name. The pip wheels of torch have no "mpi" backend
(dist.is_mpi_available() is False), so the import below registers one named "mpi4py": a process
group written in Python over mpi4py, zero-copy and non-blocking (mpi_sgd/comm/backends/torch_mpi4py.py).
mpiexec starts the processes and MPI tells each its rank, so no MASTER_ADDR, MASTER_PORT, RANK or
WORLD_SIZE is set anywhere. `--backend gloo` runs the very same script over gloo.

At the end every rank checks that all replicas hold the same parameters, bit for bit.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import mpi_sgd.comm.backends.torch_mpi4py  # noqa: F401  (registers the "mpi4py" backend)
from mpi_sgd.args import ArgumentParser, flag, positive_float, positive_int


@dataclass(frozen=True)
class Flags:
    backend: str = flag("mpi4py", "torch.distributed backend", choices=("mpi4py", "gloo"))
    epochs: int = flag(3, "passes over the data", positive_int)
    batch_size: int = flag(32, "samples per rank per step", positive_int)
    lr: float = flag(0.05, "SGD learning rate", positive_float)


args = ArgumentParser(description=__doc__).parse_flags(Flags)


def synthetic_digits(n=2048, features=64, classes=10, seed=0):
    """Overlapping Gaussian clouds around ten random centres: learnable, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    centres = 0.3 * torch.randn(classes, features, generator=g)
    y = torch.randint(classes, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, features, generator=g), y)


dist.init_process_group(args.backend)
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)  # ranks sharing a host share its cores

dataset = synthetic_digits()
sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # each rank its own 1/R of every epoch
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

torch.manual_seed(0)  # DDP broadcasts rank 0's weights anyway; seeding keeps runs repeatable
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)  # a new shuffle each epoch, the same one on every rank
    stats = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, samples
    for x, y in loader:
        optimizer.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()  # DDP all-reduces the gradient buckets while backward runs
        optimizer.step()
        stats += torch.tensor([loss.item() * len(y), (out.argmax(1) == y).sum().item(), len(y)])
    dist.all_reduce(stats)  # over every rank's samples
    if rank == 0:
        loss_avg, accuracy = stats[0] / stats[2], stats[1] / stats[2]
        print(f"epoch {epoch}  loss {loss_avg:.4f}  accuracy {accuracy:.3f}  ({world_size} rank(s), {args.backend})")

# Every rank applied the same averaged gradients to the same weights: the replicas must be equal.
mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = [torch.empty_like(mine) for _ in range(world_size)]
dist.all_gather(everyone, mine)
if rank == 0:
    same = all(torch.equal(everyone[0], other) for other in everyone)
    print(f"replicas identical on all {world_size} ranks: {same}")
    if not same:
        raise SystemExit("replicas differ: gradients were not averaged identically")
dist.destroy_process_group()
