# mpiexec -n 3 python examples/07_zero.py
"""Step 7: sharded data parallel (ZeRO stages 1-3): step 6's training, less memory per rank.

Plain data parallel keeps every parameter, gradient and optimizer state on every rank. ZeRO
(Rajbhandari et al., SC 2020) shards them over the R ranks: stage 1 the optimizer state, stage 2
the gradients too, stage 3 the parameters too; each rank updates its shard and gets the rest
from the others when it needs it (mpi_sgd/zero). This script trains the same model from the same
start on the same samples with plain data parallel and with each stage, checks that the
parameters come out equal, and prints the bytes each rank held beside the paper's formulas.
"""

import contextlib
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from mpi_sgd import comm as mpicomm
from mpi_sgd import data, gradsync, zero
from mpi_sgd.args import ArgumentParser, flag, layer_widths, positive_int
from mpi_sgd.config import TrainConfig
from mpi_sgd.models import MLP
from mpi_sgd.perfmodel import memory as memmodel
from mpi_sgd.replicas import replicate
from mpi_sgd.step import make_optimizer


@dataclass(frozen=True)
class Flags:  # many equal layers by default: one layer's transient is a small part of the total
    layers: list = flag([256, 512, 512, 512, 512, 512, 512, 1], "MLP widths", layer_widths)
    steps: int = flag(5, "optimizer steps", positive_int)
    batch_size: int = flag(16, "samples per rank per step", positive_int)
    optimizer: str = flag("adam", "adam, or sgd with momentum", choices=("adam", "sgd"))
    backend: str = flag("mpi4py", "communicator", choices=mpicomm.BACKENDS)


args = ArgumentParser(description=__doc__).parse_flags(Flags)

comm = mpicomm.init(args.backend)
R, B = comm.size, args.batch_size
# float64, so that "equal" can mean equal to within a few ulps (see the check below).
dataset = data.toy_regression(R * B * args.steps, args.layers[0], seed=1).to(torch.float64)
batches = data.rank_batches(len(dataset), comm.rank, R, B, epoch=0, seed=0)


settings = TrainConfig(optimizer=args.optimizer, lr=1e-3 if args.optimizer == "adam" else 0.01, momentum=0.9)


def train(stage: int):
    """``args.steps`` steps of plain data parallel (stage 0) or ZeRO ``stage``; returns the model and its memory."""
    # the same initial model on every rank and for every stage
    model = replicate(lambda: MLP(tuple(args.layers)).double(), comm, seed=0)
    if stage == 0:
        sync, optimizer = gradsync.make("bucketed", model, comm), make_optimizer(settings, model)
    else:
        sync, optimizer = zero.make(stage, model, comm, lambda shards: make_optimizer(settings, shards))
    tracker = zero.track_memory(sync if stage else None, model, optimizer)
    for step in range(args.steps):
        if step == args.steps - 1:
            tracker.reset()  # measure the last step, when the optimizer state exists
        idx = batches[step]
        sync.zero_grad()
        with sync.accumulate():
            # each rank's mean loss times 1/R: the ranks' gradients sum to the average
            (F.mse_loss(model(dataset.x[idx]), dataset.y[idx]) * sync.loss_scale).backward()
        sync.wait()  # ZeRO: each rank now holds its shard of the averaged gradient
        tracker.sample()
        optimizer.step()
        tracker.sample()
    every = sync.full_parameters() if stage else contextlib.nullcontext()  # stage 3 gathers the model
    with every:
        flat = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    return flat, tracker.last, tracker.peak


results = {stage: train(stage) for stage in (0, *zero.STAGES)}
psi = results[0][0].numel()

# Equal to plain data parallel: both sum the same R gradients, in another order (all-reduce vs
# reduce-scatter), so a gradient element can differ by a few ulps of the ranks' contributions
# (2.2e-16 each). SGD passes that on as it is; Adam divides by sqrt(v) + eps, which magnifies it
# by up to 1/eps = 1e8 where the contributions nearly cancel: after K steps at lr 1e-3, at most
# about K * lr * R * 2.2e-16 / eps = 4e-10 at R = 4. A wrong update (a shard skipped, applied
# twice, gathered stale) is of order lr = 1e-3. 1e-9 lies between, with margin both ways.
tolerance = 1e-9
if comm.is_root:
    print(
        f"{R} rank(s); MLP {'-'.join(map(str, args.layers))}: {psi:,} parameters (float64), "
        f"{args.optimizer}, {args.steps} steps of batch {R}x{B}"
    )
for stage in zero.STAGES:
    diff = (results[stage][0] - results[0][0]).abs().max().item()
    diff = comm.allgather_obj(diff)  # every rank checks its own replica
    if comm.is_root:
        verdict = "equal" if max(diff) <= tolerance else "DIFFERENT"
        print(
            f"ZeRO-{stage} vs plain data parallel: max |difference| {max(diff):.1e} "
            f"(tolerance {tolerance:g}): {verdict}"
        )
    if max(diff) > tolerance:
        raise SystemExit(1)

# Bytes per rank: measured on the tensors (rank 0; every rank holds the same amounts, up to
# padding) beside Rajbhandari et al.'s formulas with float64 constants: 8 B per parameter, 8 B per
# gradient, 16 B of Adam state (two moments) or 8 B of momentum.
opt = "adam" if args.optimizer == "adam" else "momentum"
if comm.is_root:
    mib = 2**20
    print(f"\nmodel-state bytes per rank (MiB) at R = {R}: measured at the optimizer step | formula")
    print("| stage | params | grads | optimizer state | total | formula total | peak in step |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for stage in (0, *zero.STAGES):
        _, at_step, peak = results[stage]
        want = memmodel.model_states(psi, stage, R, opt, "fp64")
        print(
            f"| {memmodel.STAGE_NAMES[stage]} | {at_step.params / mib:.2f} | {at_step.grads / mib:.2f} | "
            f"{at_step.optimizer / mib:.2f} | {at_step.total / mib:.2f} | {want.total / mib:.2f} | "
            f"{peak.total / mib:.2f} |"
        )
