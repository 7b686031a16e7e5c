# mpiexec -n 3 python examples/05_sgd_by_hand.py
"""Step 5: synchronous SGD by hand. R ranks with B samples each take one SGD step of batch R*B.

Every rank holds a replica of the model (LeNet, as in [S-SGD]) and trains on its own B samples of
each global batch. Two functions keep the replicas one model:

sync_initial_weights  rank 0 sends its parameters to every other rank, so all start alike
sync_gradients        after backward, one all-reduce per parameter sums the R gradients; divided
                      by R, that is the gradient of the mean loss over all R*B samples, since the
                      gradient is linear in the samples ([S-SGD], eq. 4)

Plain torch.optim.SGD then takes the same step on every rank. At the end every rank trains the
same model as one process at batch R*B on the same samples, and the parameters must agree.
"""

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from mpi_sgd import data
from mpi_sgd.args import ArgumentParser, flag, integer, positive_float, positive_int
from mpi_sgd.comm import init
from mpi_sgd.launch import placement
from mpi_sgd.models import build_model


@dataclass(frozen=True)
class Flags:
    batch_size: int = flag(16, "B, samples per rank per step", positive_int)
    epochs: int = flag(3, "passes over the dataset", positive_int)
    lr: float = flag(0.05, "learning rate", positive_float)
    seed: int = flag(0, "seed of the data order and of rank 0's model", integer)


parser = ArgumentParser(description=__doc__)
args = parser.parse_flags(Flags)

# float64, so that the final check can be tight: the runs differ only in rounding.
dataset = data.load("digits", args.seed).to(torch.float64)
try:  # one step needs R*B samples; say so before any rank starts communicating
    data.check_size(len(dataset), placement().size, args.batch_size)
except ValueError as e:
    parser.error(str(e))

comm = init()
R, B = comm.size, args.batch_size


def sync_initial_weights(model, comm):
    """Rank 0 sends each parameter to every other rank, which receives it in place."""
    for p in model.parameters():
        if comm.is_root:
            for sibling in range(1, comm.size):
                comm.send(p.data, sibling)
        else:
            comm.recv(p.data, source=0)


def sync_gradients(model, comm):
    """One all-reduce per parameter: the sum of the R gradients, then divided by R."""
    for p in model.parameters():
        comm.allreduce(p.grad, "sum")
        p.grad /= comm.size


def new_model(seed):
    torch.manual_seed(seed)
    return build_model("lenet", tuple(dataset.x.shape[1:]), dataset.num_outputs).double()


def train(model, rank, world_size, batch_size, sync=None):
    """SGD with momentum over the epochs on this rank's share of every global batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        # A permutation that every rank draws alike, cut into global batches of world_size *
        # batch_size samples; rank r takes positions [r*B, (r+1)*B) of each (mpi_sgd/data.py).
        for idx in data.rank_batches(len(dataset), rank, world_size, batch_size, epoch, args.seed):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(dataset.x[idx]), dataset.y[idx])
            loss.backward()
            if sync:
                sync(model, comm)
            optimizer.step()
    return loss.detach()


# Each rank starts from a different random model, on purpose: sync_initial_weights must mend it.
model = new_model(args.seed + comm.rank)
sync_initial_weights(model, comm)
loss = train(model, comm.rank, R, B, sync=sync_gradients)
loss = comm.allreduce(loss.reshape(1), "sum") / R
if comm.is_root:
    print(f"{R} rank(s) x batch {B} = effective batch {R * B}; loss {loss.item():.4f} (last step, mean over ranks)")

# The reference: the same loop as one process, no communication, batch R*B, rank 0's initial model.
reference = new_model(args.seed)
train(reference, 0, 1, R * B)

# Why this tolerance: in float64 the runs differ only in the order of additions (the mean over
# R*B samples at once, or R means of B summed and divided), a few ulps (2.2e-16 each) per step.
# At these settings the steps carry that forward without amplifying it (measured at R = 2..4:
# below 1e-14; a larger --lr or more --epochs make training chaotic enough to grow it). A real
# mistake leaves differences of order one: at R = 2, without the division by R the parameters
# end 1.3 apart, without sync_initial_weights 1.3, with both ranks on the same samples 0.6.
TOLERANCE = 1e-9
got = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
want = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
worst = comm.allreduce((got - want).abs().max().reshape(1), "max").item()  # over every replica
if comm.is_root:
    verdict = "agree" if worst <= TOLERANCE else "DISAGREE"
    print(
        f"max |parameter difference| against one process at batch {R * B}: {worst:.3g} "
        f"(tolerance {TOLERANCE:g}): {verdict}"
    )
if worst > TOLERANCE:
    raise SystemExit(1)
