# mpiexec -n 3 python examples/08_pipeline.py --schedule 1f1b
"""Step 8: pipeline parallelism. The model is cut into one stage per rank; micro-batches flow forward
through the stages and their gradients flow back, as point-to-point messages.

    GPipe  stage 0: F0 F1 F2 F3 .  .  .  .  B3 B2 B1 B0     all forwards, then all backwards
           stage 1: .  F0 F1 F2 F3 .  .  B3 B2 B1 B0 .
           stage 2: .  .  F0 F1 F2 F3 B3 B2 B1 B0 .  .
    1F1B   stage 0: F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3     fewer activations held, same bubble
           stage 1: .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .
           stage 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .

The gradients a stage accumulates over the m micro-batches are those of the unsplit model on the
whole batch, so each rank stepping its own stage trains exactly the unsplit model: this script
trains both (the reference in every process, on the same batches) and checks. Then it times a few
steps at m = 1, 2, 4, 8 and prints the measured bubble next to (R-1)/(m+R-1) (mpi_sgd.pipeline).
"""

import copy
import os
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from mpi_sgd.args import ArgumentParser, flag, positive_int
from mpi_sgd.comm import init
from mpi_sgd.launch import pin_threads, placement
from mpi_sgd.models import MLP
from mpi_sgd.pipeline import SCHEDULES, SPLITS, PipelineStage, cut, ideal_bubble, layers_of
from mpi_sgd.report import write_json


@dataclass(frozen=True)
class Flags:
    schedule: str = flag("1f1b", "pipeline schedule", choices=SCHEDULES)
    micro_batches: int = flag(4, "m for the equality check", positive_int)
    split: str = flag("layers", "how to cut the layers", choices=SPLITS)
    steps: int = flag(3, "training steps checked", positive_int)
    batch_size: int = flag(64, "samples per step", positive_int)
    width: int = flag(256, "units per hidden layer", positive_int)
    timeline: str | None = flag(None, "write one step at --micro-batches as a Chrome trace (Perfetto) here")

    def __post_init__(self):  # the bubble table goes up to m = 8
        if self.batch_size < (m := max(8, self.micro_batches)):
            raise ValueError(f"--batch-size {self.batch_size} cannot be cut into {m} micro-batches: give at least {m}")


parser = ArgumentParser(description=__doc__)
args = parser.parse_flags(Flags)
sizes = (32,) + (args.width,) * 5 + (10,)  # six layers, so up to six stages
if placement().size > (n := len(sizes) - 1):  # before any rank starts communicating
    parser.fail(f"this model has {n} layers, so at most {n} stages: run at most that many ranks")

comm = init("mpi4py")
pin_threads(comm.local_size)  # ranks sharing a host split its cores, as the benchmark does
torch.manual_seed(0)  # the same seed on every rank: every rank builds the same model
model = MLP(sizes).double()
reference = copy.deepcopy(model)  # the unsplit model, trained in this one process
module, bounds = cut(model, comm, by=args.split)  # this rank's layers [bounds[rank], bounds[rank+1])
mine = torch.nn.Sequential(*layers_of(reference)[bounds[comm.rank] : bounds[comm.rank + 1]])

# 1. Train the pipeline and the reference on the same batches (every rank draws the same ones).
stage = PipelineStage(comm, module, F.cross_entropy, args.schedule, args.micro_batches)
opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
worst, lines = 0.0, []
for step in range(args.steps):
    x = torch.randn(args.batch_size, sizes[0], generator=g, dtype=torch.float64)
    y = torch.randint(10, (args.batch_size,), generator=g)
    loss = stage.forward_backward(x, y)  # x is read on stage 0, y on the last stage
    opt.step()
    ref_opt.zero_grad()
    (ref_loss := F.cross_entropy(reference(x), y)).backward()
    ref_opt.step()
    if stage.last:
        worst = max(worst, abs(loss - ref_loss.item()))
        lines.append(f"step {step}: loss {loss:.6f} (unsplit {ref_loss.item():.6f})")

# 2. The equality check. Float64; micro-batches only reorder the batch's gradient sum: a few ulps.
for a, b in zip(module.parameters(), mine.parameters(), strict=True):
    worst = max(worst, (a - b).abs().max().item())
worst = max(comm.allgather_obj(worst))
lines = comm.allgather_obj(lines)[-1]  # the last stage's, printed by rank 0: two ranks' lines can interleave
tol = 1e-12
if comm.is_root:
    print(*lines, sep="\n")
    print(
        f"{comm.size} stage(s), layers cut at {bounds}, {args.schedule}, m = {args.micro_batches}: parameters and "
        f"loss vs the unsplit model\n  after {args.steps} steps: max |difference| {worst:.2g} (tolerance {tol:g}): "
        f"{'equal' if worst <= tol else 'DIFFERENT'}"
    )

# 3. The bubble: the fraction of each step the stages spend not computing, at several m.
rows = []
for m in sorted({1, 2, 4, 8, args.micro_batches}):
    timed = PipelineStage(comm, module, F.cross_entropy, args.schedule, m)
    for k in range(4):  # the first step pays for allocation: dropped
        if args.timeline and k == 3 and m == args.micro_batches:
            timed.start_timeline()  # record this last step's F and B boxes on every rank
        timed.forward_backward(x, y)
    per_rank = comm.allgather_obj([sum(s[key] for s in timed.stats[1:]) for key in ("busy", "span")])
    busy, span = zip(*per_rank, strict=True)
    rows.append((m, 1e3 * max(span) / 3, 1 - sum(busy) / sum(span), ideal_bubble(comm.size, m)))
    per_op_ms = 1e3 * sum(busy) / (3 * 2 * m * comm.size)  # 3 timed steps of m forwards and m backwards
    if timed.events is not None:
        trace = timed.timeline()
if args.timeline and comm.is_root:
    write_json(args.timeline, trace)
if comm.is_root:
    shared = " (more ranks than cores: the bubble also counts ranks waiting for a core)"
    print(f"\n{args.schedule}, R = {comm.size}{shared if comm.local_size > (os.cpu_count() or 1) else ''}")
    print("|  m | step ms | bubble | (R-1)/(m+R-1) |\n|---:|--------:|-------:|--------------:|")
    for m, ms, measured, ideal in rows:
        print(f"| {m:2d} | {ms:7.2f} | {measured:6.3f} | {ideal:13.3f} |")
    # At this size the table would mislead without a word: fixed costs, not the schedule, dominate it.
    print(f"(an op takes about {per_op_ms:.2f} ms at m = {rows[-1][0]}: the fixed cost of each op and message,")
    print(" paid m times, weighs as much as the compute; mpi-sgd bench pipeline times a model large enough for it)")
if worst > tol:
    raise SystemExit(1)
