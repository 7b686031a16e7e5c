# python examples/speedup.py --t-comp 1 --t-sync 1 --ranks 1,2,3,4
"""Will R more ranks pay? Per epoch ([S-SGD]'s law) and to accuracy (the gradient noise scale), for your numbers.

Per epoch, T_epoch = N/(R·B)·(T_comp + T_sync): distribution pays iff T_sync/T_comp < R − 1. To a
target accuracy, the global batch R·B needs S_min·(1 + B_noise/R·B) steps (McCandlish et al. 2018),
so past the critical batch B_noise more ranks stop paying: give --b-noise (or --metrics-json of a
run with --noise-scale) for that answer beside the first. T_comp and T_sync come from flags, from a
calibration measured on your machine, or from a network's α and β and your parameter count:

    python examples/speedup.py --calibrate --save results/calibration.json    # starts mpiexec -n 2
    mpiexec -n 4 python examples/speedup.py --calibrate                        # or measure at 4
    python examples/speedup.py --calibration results/calibration.json --ranks 1,2,4,8,16
    python examples/speedup.py --calibration results/calibration.json --network 10gbe
    python examples/speedup.py --t-comp 0.008 --network ib100 --params 1.86M --ranks 1,2,4,8,64
    python examples/speedup.py --t-comp 0.0011 --t-sync 0.0002 --batch-size 32 --ranks 1,2,8,16 --b-noise 50
"""

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from mpi_sgd import perfmodel as pm
from mpi_sgd.args import (
    ArgumentParser,
    flag,
    layer_widths,
    nbytes,
    nonneg_float,
    positive_float,
    positive_int,
    rank_list,
)
from mpi_sgd.calibrate import Calibration, SweepRefused, run_calibration
from mpi_sgd.report import markdown_table

MAX_BYTES = 16 << 20  # the calibration's largest all-reduce, above the MLP's 7.5 MB of gradients


@dataclass(frozen=True)
class Flags:
    t_comp: float | None = flag(None, "seconds of forward+backward+step per batch, one rank", positive_float)
    t_sync: float | None = flag(None, "seconds of gradient all-reduce per step at R > 1", nonneg_float)
    calibration: Path | None = flag(None, "JSON written by --calibrate --save", Path)
    calibrate: bool = flag(False, "measure T_comp, α, β here (one process starts mpiexec -n 2)")
    save: Path | None = flag(None, "with --calibrate: write the calibration to this JSON file", Path)
    max_bytes: int = flag(MAX_BYTES, "with --calibrate: largest all-reduce", nbytes)
    layers: list | None = flag(None, "with --calibrate: MLP widths to time (default: --model mlp's)", layer_widths)
    alpha: float | None = flag(None, "latency per message, seconds", nonneg_float)
    beta: float | None = flag(None, "seconds per byte sent (1/bandwidth)", nonneg_float)
    gamma: float = flag(0.0, "seconds per byte reduced", nonneg_float)
    network: str | None = flag(None, "what-if: a typical network's α, β, γ", choices=sorted(pm.PRESETS))
    params: int | None = flag(
        None, "model parameters (float32 gradients), for α-β costs: 1863690, 25M, 7.5B", positive_int
    )
    algorithm: str = flag("ring", "all-reduce cost formula", choices=pm.ALLREDUCE_ALGORITHMS)
    ranks: list = flag([1, 2, 4, 8], "R values", rank_list)
    samples: int = flag(60_000, "N, samples per epoch", positive_int)
    batch_size: int = flag(64, "B: per-rank (weak) or global (strong) batch", positive_int)
    scaling: str = flag("weak", "weak: fixed per-rank B; strong: fixed global B", choices=pm.SCALINGS)
    plot: Path | None = flag(None, "also draw speedup against R into this PNG, e.g. results/speedup.png", Path)
    b_noise: float | None = flag(None, "the gradient noise scale B_noise, for the time-to-target answer", nonneg_float)
    metrics_json: Path | None = flag(
        None, "read B_noise from a run's --metrics-json (trained with --noise-scale)", Path
    )
    s_min: float | None = flag(
        None, "fewest steps to the target at any batch, for times to it in seconds", positive_float
    )

    def __post_init__(self):  # every check that can fail, before a rank measures or communicates
        measured, network = self.calibrate or self.calibration, self.alpha is not None or self.network
        if self.t_comp is None and not measured:
            raise ValueError("give --t-comp, --calibration FILE or --calibrate")
        if (self.alpha is None) != (self.beta is None) or (self.alpha is not None and self.network):
            raise ValueError("give --network, or --alpha and --beta together")
        if self.t_sync is None and not (network or measured):
            raise ValueError("give --t-sync, --alpha/--beta, --network or a calibration")
        if self.t_sync is None and not (self.params or measured):
            raise ValueError("an α-β cost needs --params (the gradient size) unless a calibration supplies it")
        if self.scaling == "strong" and max(self.ranks) > self.batch_size:
            raise ValueError(f"strong scaling splits --batch-size {self.batch_size} over up to {max(self.ranks)} ranks")
        # A flag whose value would go unused is refused, not ignored.
        if self.t_sync is not None and (network or self.params or self.gamma or self.algorithm != "ring"):
            raise ValueError(
                "--t-sync is T_sync itself: --network, --alpha, --beta, --gamma, --params, --algorithm unused"
            )
        if self.gamma and self.alpha is None:
            raise ValueError("--gamma goes with --alpha and --beta (a network or a calibration has its own)")
        if self.calibrate and self.calibration or self.calibration and None not in (self.t_comp, self.t_sync):
            raise ValueError("--calibration would go unused beside --calibrate, or beside --t-comp and --t-sync")
        if not self.calibrate and (self.save or self.layers or self.max_bytes != MAX_BYTES):
            raise ValueError("--save, --max-bytes and --layers go with --calibrate")
        if self.b_noise is not None and self.metrics_json:
            raise ValueError("give --b-noise or --metrics-json, not both")
        if self.s_min is not None and self.b_noise is None and not self.metrics_json:
            raise ValueError("--s-min goes with --b-noise or --metrics-json (the time-to-target answer)")


def b_noise_of_run(path: Path) -> float:
    """B_noise of a run with --noise-scale, from its --metrics-json: the mean over the epochs of tr Σ
    over the mean of |G|² (McCandlish et al.: a ratio of means, not a mean of each epoch's noisy ratio)."""
    try:
        noise = [e["noise"] for e in json.loads(path.read_text())["epochs"] if e.get("noise")]
        pairs = [(n["g2"], n["trace"]) for n in noise if n["g2"] is not None and n["trace"] is not None]
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.fail(f"cannot read B_noise from {path}: {e}")
    if not pairs:
        parser.fail(f"{path} holds no B_noise: train with --noise-scale")
    g2, trace = (statistics.fmean(column) for column in zip(*pairs, strict=True))
    if not (g2 > 0 and trace > 0):  # either estimate still noise (mpi_sgd.noisescale.noise_scale)
        parser.fail(f"{path}: the epochs' estimates average to |G|^2 {g2:.4g}, tr Sigma {trace:.4g}: no B_noise yet")
    return trace / g2


parser = ArgumentParser(description=__doc__)
args = parser.parse_flags(Flags)
network_given = args.alpha is not None or args.network
calib = None
if args.calibrate:  # as one process, α and β are measured by an mpiexec -n 2 job it starts
    need_network = args.t_sync is None and not network_given
    try:
        calib = run_calibration(args.save, args.max_bytes, args.layers, args.batch_size, args.algorithm, need_network)
    except SweepRefused as e:  # a measurement the fit refused, said in one line
        parser.fail(f"calibration: {e}")
    if calib is None:
        sys.exit(0)  # not the root: the model is arithmetic, one rank prints it
    print(
        f"measured at {calib.meta['ranks']} rank(s): T_comp {calib.step.seconds * 1e3:.3f} ms "
        f"({calib.step.model}, batch {args.batch_size}); {calib.network.describe()}"
    )
    if args.save:
        print(f"calibration saved to {args.save}")
elif args.calibration:
    try:
        calib = Calibration.load(args.calibration)
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"cannot read calibration {args.calibration}: {e}")

compute = pm.Compute(args.t_comp, args.batch_size) if args.t_comp is not None else calib.compute()
if args.t_sync is not None:
    sync = pm.FixedSync(args.t_sync)
else:
    if args.alpha is not None:
        network = pm.Network(args.alpha, args.beta, args.gamma, "given")
    else:
        network = pm.PRESETS[args.network] if args.network else calib.network
    params = args.params or calib.step.params
    sync = pm.AllreduceSync(network, 4 * params, args.algorithm)

points = pm.scaling(compute, sync, args.ranks, args.samples, args.batch_size, args.scaling)
print(f"T_comp = {compute.t_comp:g} s at batch {compute.batch}; {sync.describe()}")
print(f"N = {args.samples} samples, B = {args.batch_size} ({args.scaling} scaling)")
defaults = [f for f, used in (("--samples", args.samples == 60_000), ("--batch-size", args.batch_size == 64)) if used]
if defaults:  # the answer depends on them: say so rather than assume silently
    print(f"(assumed: the default{'s' if len(defaults) > 1 else ''} of {' and '.join(defaults)}; give yours)")
measured_at = calib.meta.get("ranks") if calib is not None and args.t_sync is None else None
if measured_at and max(args.ranks) > measured_at:
    print(
        f"* R above {measured_at}: extrapolated by the α-β model from a calibration measured at {measured_at} rank(s)"
    )
print()
print(markdown_table(pm.TABLE_HEADERS, pm.table_rows(points)))
print("\ndistribution pays iff T_sync/T_comp < R - 1 ([S-SGD])")
for p in points[1:] if args.scaling == "strong" else ():
    if p.pays and p.efficiency < 0.5:
        print(
            f"R = {p.ranks} pays only {p.speedup:.2f}x for {p.ranks}x the ranks (efficiency {100 * p.efficiency:.0f}%)"
        )

b_noise = b_noise_of_run(args.metrics_json) if args.metrics_json else args.b_noise
target = None
if b_noise is not None:
    target = pm.time_to_target(compute, sync, args.ranks, args.batch_size, b_noise, args.s_min, args.scaling)
    source = f"the epochs' mean estimates in {args.metrics_json}" if args.metrics_json else "--b-noise"
    print(f"\nto a target accuracy: B_noise = {b_noise:.4g} ({source}); steps S(B) = S_min(1 + B_noise/B)\n")
    print(markdown_table(pm.TARGET_HEADERS, pm.target_rows(target, measured_at)))
    print("steps (x R=1): steps to the target over R = 1's; pays/target: sooner than R = 1, by 'target speedup'")
    for p in target[1:]:
        if p.pays_epoch != p.pays:  # the two laws disagree on the verdict
            says = f"pays per epoch ({p.speedup_epoch:.2f}x) but not to the target ({p.speedup_target:.2f}x)"
        elif p.speedup_target < 0.5 * p.speedup_epoch:  # or on how much by a factor of 2 or more
            says = f"{p.speedup_epoch:.2f}x per epoch but only {p.speedup_target:.2f}x to the target"
        else:
            continue
        steps = f"global batch {p.global_batch:g} against B_noise {b_noise:.3g} needs {p.steps_ratio:.2f}x the steps"
        print(f"R = {p.ranks}: {says}:\n    {steps} of R = 1, not 1/{p.ranks}")
    fastest = pm.best(target)
    print(f"fastest to the target: R = {fastest.ranks} ({fastest.speedup_target:.2f}x R = 1)")
    if args.scaling == "weak":  # T_comp scales linearly with the batch (perfmodel.Compute)
        r, tried = max(args.ranks), sorted({max(1, args.batch_size * k // 4) for k in (1, 2, 4, 8, 16)})
        b, _ = pm.best_batch(compute, sync, r, tried, b_noise)
        print(f"at R = {r}, of per-rank batches {','.join(map(str, tried))}, {b} reaches the target soonest")
    if args.s_min is not None:
        print("time to the target: " + ", ".join(f"R = {p.ranks}: {p.seconds:.4g} s" for p in target))

if args.plot:
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    if target is not None:
        print(f"plot written to {pm.plot_target(target, args.plot, f'{sync.describe()}; B_noise {b_noise:.3g}')}")
    else:
        print(f"plot written to {pm.plot_scaling(points, args.plot, sync.describe())}")
