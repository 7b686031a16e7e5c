# python examples/which_strategy.py --params 1863690 --memory 1GiB --network 10gbe --ranks 8 --t-comp 0.01
"""Which parallelism fits your model, memory, network and cluster? A first-order answer.

For each strategy (data parallel, ZeRO stages 1-3, pipeline, parameter server) it prints the
model state one rank must hold (parameters, gradients, optimizer state: add your activations),
whether that fits --memory, the bytes each rank sends per step and, given --t-comp, the predicted
gradients per second; then the strategy to use and why. The formulas and their sources are in
mpi_sgd/guide.py; docs/use/choosing.md sets them beside what was measured.

  python examples/which_strategy.py --params 7000000000 --memory 40GiB --network ib100 --ranks 64 --optimizer adam
  python examples/which_strategy.py --params 25000000 --memory 8GiB --network 1gbe --ranks 16 --t-comp .05 --slowdown 3
"""

from mpi_sgd import guide
from mpi_sgd.args import ArgumentParser, nbytes, nonneg_float, positive_float, positive_int
from mpi_sgd.perfmodel import PRESETS, Network
from mpi_sgd.report import markdown_table

parser = ArgumentParser(description=__doc__)
flag = parser.add_argument
flag("--params", type=positive_int, required=True, help="model parameters (float32)")
flag("--memory", type=nbytes, required=True, help="memory per rank for model state, e.g. 16GiB")
flag("--network", choices=sorted(PRESETS), help="a typical network's α and β")
flag("--alpha", type=nonneg_float, help="or: latency per message, seconds ...")
flag("--beta", type=nonneg_float, help="... and seconds per byte (1/bandwidth)")
flag("--ranks", type=positive_int, required=True, help="R, ranks (processes, GPUs) in the job")
flag("--optimizer", choices=sorted(guide.OPTIMIZER_STATE), default="momentum", help="optimizer state (momentum)")
flag("--t-comp", type=positive_float, help="seconds of forward + backward per batch on one rank")
flag("--slowdown", type=positive_float, default=1.0, help="the slowest rank's T_comp over the others' (1)")
flag("--servers", type=positive_int, default=1, help="parameter-server ranks (1)")
flag("--micro-batches", type=positive_int, default=8, help="pipeline micro-batches per batch (8)")
flag("--boundary-bytes", type=nbytes, default=0, help="pipeline: activation bytes per batch at a stage boundary")
args = parser.parse_args()

if (args.alpha is None) != (args.beta is None):
    parser.error("--alpha and --beta go together")
if args.network is None and args.alpha is None:
    parser.error("give --network or --alpha and --beta")
if args.slowdown < 1:
    parser.error(f"--slowdown is the slowest rank's time over the others', at least 1; got {args.slowdown}")
network = PRESETS[args.network] if args.network else Network(args.alpha, args.beta, 0.0, "given")
problem = guide.Problem(
    args.params,
    args.memory,
    network,
    args.ranks,
    args.optimizer,
    args.t_comp,
    args.slowdown,
    args.servers,
    args.micro_batches,
    args.boundary_bytes,
)
choice, estimates, why = guide.recommend(problem)

print(f"{args.params:,} parameters, {args.memory / 2**30:g} GiB per rank, {args.ranks} ranks, {network.describe()}")
alone = 1 / args.t_comp if args.t_comp else None
rows = []
for e in estimates:
    rate = f"{e.gradients_per_s:.3g}" if e.gradients_per_s else "-"
    speedup = f"{e.gradients_per_s * args.t_comp:.2f}" if e.gradients_per_s and alone else "-"
    rows.append(
        (
            e.strategy,
            f"{e.memory / 2**30:.3g}",
            "yes" if e.fits else "no",
            f"{e.bytes_per_step / 2**20:.4g}",
            rate,
            speedup,
            e.note,
        )
    )
headers = ("strategy", "state GiB/rank", "fits?", "MiB sent/step", "gradients/s", "vs 1 rank", "note")
print(markdown_table(headers, rows))
print(f"\nuse: {choice}: {why}")
