# python examples/speedup.py --t-comp 1 --t-sync 1 --ranks 1,2,3,4
"""Will R more ranks pay? [S-SGD]'s law, T_epoch = N/(R·B)·(T_comp + T_sync), for your numbers.

Distribution pays iff T_sync/T_comp < R − 1. T_comp and T_sync come from flags, from a
calibration measured on your machine, or from a network's α and β and your parameter count:

    python examples/speedup.py --calibrate --save results/calibration.json    # starts mpiexec -n 2
    mpiexec -n 4 python examples/speedup.py --calibrate                        # or measure at 4
    python examples/speedup.py --calibration results/calibration.json --ranks 1,2,4,8,16
    python examples/speedup.py --calibration results/calibration.json --network 10gbe
    python examples/speedup.py --t-comp 0.008 --network ib100 --params 1863690 --ranks 1,2,4,8,64
"""

import sys
from pathlib import Path

from mpi_sgd import perfmodel as pm
from mpi_sgd.args import ArgumentParser, nbytes, nonneg_float, positive_float, positive_int, positive_ints, rank_list
from mpi_sgd.calibrate import Calibration, run_calibration
from mpi_sgd.report import markdown_table

parser = ArgumentParser(description=__doc__)
flag = parser.add_argument
flag("--t-comp", type=positive_float, help="seconds of forward+backward+step per batch, one rank")
flag("--t-sync", type=nonneg_float, help="seconds of gradient all-reduce per step at R > 1")
flag("--calibration", type=Path, help="JSON written by --calibrate --save")
flag("--calibrate", action="store_true", help="measure T_comp, α, β here (one process starts mpiexec -n 2)")
flag("--save", type=Path, help="with --calibrate: write the calibration to this JSON file")
flag("--max-bytes", type=nbytes, default=16 << 20, help="with --calibrate: largest all-reduce (16MiB)")
flag("--layers", type=positive_ints, help="with --calibrate: MLP widths to time (default: --model mlp's)")
flag("--alpha", type=nonneg_float, help="latency per message, seconds")
flag("--beta", type=nonneg_float, help="seconds per byte sent (1/bandwidth)")
flag("--gamma", type=nonneg_float, default=0.0, help="seconds per byte reduced (default 0)")
flag("--network", choices=sorted(pm.PRESETS), help="what-if: a typical network's α, β, γ")
flag("--params", type=positive_int, help="model parameters (float32 gradients), for α-β costs")
flag("--algorithm", choices=pm.ALLREDUCE_ALGORITHMS, default="ring", help="all-reduce cost formula")
flag("--ranks", type=rank_list, default=[1, 2, 4, 8], help="R values (default 1,2,4,8)")
flag("--samples", type=positive_int, default=60_000, help="N, samples per epoch (default 60000)")
flag("--batch-size", type=positive_int, default=64, help="B: per-rank (weak) or global (strong) batch (64)")
flag("--scaling", choices=pm.SCALINGS, default="weak", help="weak: fixed per-rank B; strong: fixed global B")
flag("--plot", type=Path, help="also draw speedup against R into this PNG, e.g. results/speedup.png")
args = parser.parse_args()

# Every check that can fail does so here, before a rank starts measuring or communicating.
measured = args.calibrate or args.calibration
network_given = args.alpha is not None or args.network
if args.t_comp is None and not measured:
    parser.error("give --t-comp, --calibration FILE or --calibrate")
if (args.alpha is None) != (args.beta is None):
    parser.error("--alpha and --beta go together")
if args.t_sync is None and not (network_given or measured):
    parser.error("give --t-sync, --alpha/--beta, --network or a calibration")
if args.t_sync is None and not (args.params or measured):
    parser.error("an α-β cost needs --params (the gradient size) unless a calibration supplies it")
if args.layers is not None and len(args.layers) < 2:
    parser.error("--layers needs at least an input and an output width, e.g. 784,1024,10")
if args.scaling == "strong" and max(args.ranks) > args.batch_size:
    parser.error(f"strong scaling splits --batch-size {args.batch_size} over up to {max(args.ranks)} ranks")

calib = None
if args.calibrate:  # as one process, α and β are measured by an mpiexec -n 2 job it starts
    need_network = args.t_sync is None and not network_given
    calib = run_calibration(args.save, args.max_bytes, args.layers, args.batch_size, args.algorithm, need_network)
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
print(f"N = {args.samples} samples, B = {args.batch_size} ({args.scaling} scaling)\n")
print(markdown_table(pm.TABLE_HEADERS, pm.table_rows(points)))
print("\ndistribution pays iff T_sync/T_comp < R - 1 ([S-SGD])")

if args.plot:
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    print(f"plot written to {pm.plot_scaling(points, args.plot, sync.describe())}")
