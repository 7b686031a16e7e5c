# python examples/which_strategy.py --params 1863690 --memory 1GiB --network 10gbe --ranks 8 --t-comp 0.01
"""Which parallelism fits your model, memory, network and cluster? A first-order answer.

For each strategy (data parallel, ZeRO stages 1-3, pipeline, parameter server) it prints the
model state one rank must hold (parameters, gradients, optimizer state: add your activations),
whether that fits --memory, the bytes each rank sends per step and, given --t-comp, the predicted
gradients per second; then the strategy to use and why. The formulas and their sources are in
mpi_sgd/guide.py; docs/use/choosing.md sets them beside what was measured.

  python examples/which_strategy.py --params 7B --memory 40GiB --network ib100 --ranks 64 --optimizer adam
  python examples/which_strategy.py --params 25M --memory 8GiB --network 1gbe --ranks 16 --t-comp .05 --slowdown 3
  python examples/which_strategy.py --params 1863690 --memory 1GiB --network 10gbe --ranks 16 --t-comp 0.01 --b-noise 50

With --b-noise (the gradient noise scale, measured by sync_sgd.py --noise-scale) data parallelism's
gradients count at their worth to accuracy: past the critical batch, R of them buy less than R steps.
"""

from dataclasses import dataclass

from mpi_sgd import guide
from mpi_sgd.args import ArgumentParser, flag, nbytes, nonneg_float, positive_float, positive_int
from mpi_sgd.perfmodel import PRESETS, Network
from mpi_sgd.report import markdown_table


@dataclass(frozen=True)
class Flags:
    params: int = flag(0, "model parameters (float32): 1863690, 25M, 25.6e6, 7B", positive_int, required=True)
    memory: int = flag(0, "memory per rank for model state, e.g. 16GiB", nbytes, required=True)
    ranks: int = flag(0, "R, ranks (processes, GPUs) in the job", positive_int, required=True)
    network: str | None = flag(None, "a typical network's α and β", choices=sorted(PRESETS))
    alpha: float | None = flag(None, "or: latency per message, seconds ...", nonneg_float)
    beta: float | None = flag(None, "... and seconds per byte (1/bandwidth)", nonneg_float)
    optimizer: str = flag("momentum", "optimizer state", choices=sorted(guide.OPTIMIZER_STATE))
    t_comp: float | None = flag(None, "seconds of forward + backward per batch on one rank", positive_float)
    slowdown: float = flag(1.0, "the slowest rank's T_comp over the others', at least 1", positive_float)
    servers: int = flag(1, "parameter-server ranks", positive_int)
    micro_batches: int = flag(8, "pipeline micro-batches per batch", positive_int)
    boundary_bytes: int = flag(0, "pipeline: activation bytes per batch at a stage boundary", nbytes)
    b_noise: float | None = flag(None, "the gradient noise scale: count data parallelism to accuracy", nonneg_float)
    batch_size: int = flag(32, "per-rank batch, with --b-noise (the global batch is R times it)", positive_int)

    def __post_init__(self):
        if (self.alpha is None) != (self.beta is None) or (self.network is None) == (self.alpha is None):
            raise ValueError("give --network or --alpha and --beta")
        if self.slowdown < 1:
            raise ValueError(f"--slowdown is the slowest rank's time over the others', at least 1; got {self.slowdown}")
        if self.slowdown != 1 and self.t_comp is None:
            raise ValueError("--slowdown scales --t-comp, which is not given")
        if self.b_noise is not None and self.t_comp is None:
            raise ValueError("--b-noise weighs the gradients per second that --t-comp gives: give --t-comp")
        if self.batch_size != 32 and self.b_noise is None:
            raise ValueError("--batch-size goes with --b-noise")


args = ArgumentParser(description=__doc__).parse_flags(Flags)
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
    args.b_noise,
    args.batch_size,
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
