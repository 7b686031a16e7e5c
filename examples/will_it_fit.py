# python examples/will_it_fit.py --params 7.5B --ranks 1,8,64 --memory 80GiB
"""Will it fit? Model-state bytes per rank under plain data parallel and ZeRO stages 1-3.

A model of Ψ parameters holds parameters, gradients and optimizer state; plain data parallel
keeps all three on every rank, ZeRO stage 1 shards the optimizer state over the R ranks, stage
2 the gradients too, stage 3 the parameters too (Rajbhandari et al., SC 2020; the formulas are
in mpi_sgd/perfmodel/memory.py). Activations and buffers come on top of what is shown here.

    python examples/will_it_fit.py --params 7.5B --precision mixed --ranks 64   # the paper's Figure 1
    python examples/will_it_fit.py --params 25M --optimizer momentum --memory 24GiB
"""

from dataclasses import dataclass

from mpi_sgd.args import ArgumentParser, flag, nbytes, positive_int, rank_list
from mpi_sgd.perfmodel import memory as mm
from mpi_sgd.report import markdown_table


@dataclass(frozen=True)
class Flags:
    params: int = flag(7_500_000_000, "model parameters Ψ, e.g. 350M, 7.5B or 1.2e9", positive_int)
    optimizer: str = flag("adam", "its state per parameter", choices=sorted(mm.OPTIMIZERS))
    precision: str = flag(
        "fp32",
        "fp32: 4 B each; fp64; mixed: fp16 weights, gradients + fp32 master copy",
        choices=sorted(mm.PRECISIONS),
    )
    ranks: list = flag([1, 8, 64], "data-parallel ranks R", rank_list)
    memory: int = flag(80 << 30, "memory per rank for model states", nbytes)


args = ArgumentParser(description=__doc__).parse_flags(Flags)
psi = args.params

GiB = 2**30
p, g, k = mm.constants(args.optimizer, args.precision)
print(
    f"Ψ = {psi:,} parameters, {args.precision}: {p} B parameter + {g} B gradient + {k} B {args.optimizer} "
    f"state each; {args.memory / GiB:g} GiB per rank\n"
)

rows = []
for ranks in args.ranks:
    for stage in mm.STAGES:
        s = mm.model_states(psi, stage, ranks, args.optimizer, args.precision)
        fits = "yes" if s.total <= args.memory else "no"
        rows.append(
            [ranks, mm.STAGE_NAMES[stage], s.params / GiB, s.grads / GiB, s.optimizer / GiB, s.total / GiB, fits]
        )
print(markdown_table(["R", "stage", "params GiB", "grads GiB", "optimizer GiB", "total GiB", "fits?"], rows))

print(f"\nlargest model whose states fit in {args.memory / GiB:g} GiB per rank:\n")
rows = [
    [ranks]
    + [f"{mm.largest_model(args.memory, stage, ranks, args.optimizer, args.precision):,}" for stage in mm.STAGES]
    for ranks in args.ranks
]
print(markdown_table(["R"] + [mm.STAGE_NAMES[s] for s in mm.STAGES], rows))
print(
    "\ncommunication per rank per step, in elements (stage 0 = plain data parallel):\n"
    + ", ".join(f"stage {s}: {mm.COMM_VOLUME[s]}Ψ" for s in mm.STAGES)
)
