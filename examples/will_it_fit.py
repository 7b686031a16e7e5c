# python examples/will_it_fit.py --params 7.5B --ranks 1,8,64 --memory 80GiB
"""Will it fit? Model-state bytes per rank under plain data parallel and ZeRO stages 1-3.

A model of Ψ parameters holds parameters, gradients and optimizer state; plain data parallel
keeps all three on every rank, ZeRO stage 1 shards the optimizer state over the R ranks, stage
2 the gradients too, stage 3 the parameters too (Rajbhandari et al., SC 2020; the formulas are
in mpi_sgd/perfmodel/memory.py). Activations and buffers come on top of what is shown here.

    python examples/will_it_fit.py --params 7.5B --precision mixed --ranks 64   # the paper's Figure 1
    python examples/will_it_fit.py --params 25M --optimizer momentum --memory 24GiB
"""

from mpi_sgd.args import ArgumentParser, nbytes, rank_list
from mpi_sgd.perfmodel import memory as mm
from mpi_sgd.report import markdown_table

SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parameter_count(text: str) -> int:
    """'7.5B', '350M', '1.2e9' -> a number of parameters."""
    scale = SUFFIX.get(text.strip()[-1:].upper(), 1)
    try:
        value = float(text.strip()[:-1] if scale > 1 else text)
    except ValueError:
        raise ValueError(f"not a parameter count: {text!r} (try 350M, 7.5B or 1.2e9)") from None
    if not value > 0:
        raise ValueError(f"the parameter count must be positive, got {text!r}")
    return round(value * scale)


parser = ArgumentParser(description=__doc__)
parser.add_argument("--params", default="7.5B", help="model parameters, e.g. 350M, 7.5B (default 7.5B)")
parser.add_argument("--optimizer", choices=sorted(mm.OPTIMIZERS), default="adam", help="its state per parameter (adam)")
parser.add_argument(
    "--precision",
    choices=sorted(mm.PRECISIONS),
    default="fp32",
    help="fp32: 4 B each; fp64; mixed: fp16 weights, gradients + fp32 master copy (fp32)",
)
parser.add_argument("--ranks", type=rank_list, default=[1, 8, 64], help="data-parallel ranks R (1,8,64)")
parser.add_argument("--memory", type=nbytes, default=80 << 30, help="memory per rank for model states (80GiB)")
args = parser.parse_args()
try:
    psi = parameter_count(args.params)
except ValueError as e:
    parser.error(str(e))

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
    f"\ncommunication per rank per step: {', '.join(f'stage {s}: {mm.COMM_VOLUME[s]}Ψ' for s in mm.STAGES)} "
    "elements (stage 0 = plain data parallel)"
)
