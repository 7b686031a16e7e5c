"""Will R more ranks pay? Seed 003's law, T_epoch = N/(R·B)·(T_comp + T_sync), for your numbers.

    python examples/speedup.py --t-comp 1 --t-sync 1 --ranks 1,2,3,4

Distribution pays iff T_sync/T_comp < R − 1. T_comp and T_sync come from flags, from a
calibration measured on your machine, or from a network's α and β and your parameter count:

    mpiexec -n 2 python examples/speedup.py --calibrate --save results/calibration.json
    python examples/speedup.py --calibration results/calibration.json --ranks 1,2,4,8,16
    python examples/speedup.py --calibration results/calibration.json --network 10gbe
    python examples/speedup.py --t-comp 0.008 --network ib100 --params 1863690 --ranks 1,2,4,8,64
"""

import argparse
import sys
from pathlib import Path

from mpi_sgd import argtypes
from mpi_sgd.calibrate import PRESETS, Calibration, calibrate, sweep_sizes
from mpi_sgd.launch import placement
from mpi_sgd.perfmodel import (ALLREDUCE_ALGORITHMS, TABLE_HEADERS, AllreduceSync, Compute, FixedSync, Network,
                               markdown_table, plot_scaling, scaling, table_rows)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--t-comp", type=argtypes.positive_float, help="seconds of forward+backward+step per batch")
parser.add_argument("--t-sync", type=argtypes.nonneg_float, help="seconds of gradient all-reduce per step (R > 1)")
parser.add_argument("--calibration", type=Path, help="JSON written by --calibrate --save")
parser.add_argument("--calibrate", action="store_true", help="measure T_comp (and α, β under mpiexec) here")
parser.add_argument("--save", type=Path, help="with --calibrate: write the calibration to this JSON file")
parser.add_argument("--max-bytes", type=argtypes.nbytes, default=16 << 20,
                    help="with --calibrate: largest all-reduce in the sweep (default 16MiB)")
parser.add_argument("--layers", type=argtypes.positive_ints, default=[784, 1024, 1024, 10],
                    help="with --calibrate: MLP layer widths to time (default 784,1024,1024,10)")
parser.add_argument("--alpha", type=argtypes.nonneg_float, help="latency per message, seconds")
parser.add_argument("--beta", type=argtypes.nonneg_float, help="seconds per byte sent (1/bandwidth)")
parser.add_argument("--gamma", type=argtypes.nonneg_float, default=0.0, help="seconds per byte reduced (default 0)")
parser.add_argument("--network", choices=sorted(PRESETS), help="what-if: a typical network's α, β, γ")
parser.add_argument("--params", type=argtypes.positive_int, help="model parameters (float32 gradients)")
parser.add_argument("--algorithm", choices=ALLREDUCE_ALGORITHMS, default="ring", help="all-reduce cost formula")
parser.add_argument("--ranks", type=argtypes.positive_ints, default=[1, 2, 4, 8], help="R values (default 1,2,4,8)")
parser.add_argument("--samples", type=argtypes.positive_int, default=60_000, help="N, samples per epoch")
parser.add_argument("--batch", type=argtypes.positive_int, default=64,
                    help="B: per-rank batch (weak) or global batch (strong) (default 64)")
parser.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                    help="weak: fixed per-rank batch, seed 003 (default); strong: fixed global batch")
parser.add_argument("--plot", type=Path, default=Path("results/speedup.png"), help="PNG to write")
args = parser.parse_args()

# Every check that can fail does so here, before a rank starts measuring or communicating.
measured = args.calibrate or args.calibration
if args.t_comp is None and not measured:
    parser.error("give --t-comp, --calibration FILE or --calibrate")
if (args.alpha is None) != (args.beta is None):
    parser.error("--alpha and --beta go together")
if args.t_sync is None and args.alpha is None and not (args.network or measured):
    parser.error("give --t-sync, --alpha/--beta, --network or a calibration")
if args.t_sync is None and not (args.params or measured):
    parser.error("an α-β cost needs --params (the gradient size) unless a calibration supplies it")
if args.calibrate and placement().size == 1 and args.t_sync is None and not (args.alpha or args.network):
    parser.error("α and β need two ranks: mpiexec -n 2 python examples/speedup.py --calibrate "
                 "(or give --t-sync, --alpha/--beta or --network)")
if args.scaling == "strong" and max(args.ranks) > args.batch:
    parser.error(f"strong scaling splits --batch {args.batch} over up to {max(args.ranks)} ranks")

calib = None
if args.calibrate:
    from mpi_sgd.comm import init

    comm = init("mpi4py")
    calib = calibrate(comm, sweep_sizes(max_bytes=args.max_bytes), args.layers, args.batch, args.algorithm)
    if not comm.is_root:
        sys.exit(0)  # the model is arithmetic: one rank prints it
    print(f"measured at {comm.size} rank(s): T_comp {calib.step.seconds * 1e3:.3f} ms "
          f"({calib.step.model}, batch {args.batch}); {calib.network.describe()}")
    if args.save:
        print(f"calibration saved to {calib.save(args.save)}")
elif args.calibration:
    try:
        calib = Calibration.load(args.calibration)
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"cannot read calibration {args.calibration}: {e}")

compute = Compute(args.t_comp, args.batch) if args.t_comp is not None else calib.compute()
if args.t_sync is not None:
    sync = FixedSync(args.t_sync)
else:
    if args.alpha is not None:
        network = Network(args.alpha, args.beta, args.gamma, "given")
    else:
        network = PRESETS[args.network] if args.network else calib.network
    params = args.params or calib.step.params
    sync = AllreduceSync(network, 4 * params, args.algorithm)

points = scaling(compute, sync, args.ranks, args.samples, args.batch, args.scaling)
print(f"T_comp = {compute.t_comp:g} s at batch {compute.batch}; {sync.describe()}")
print(f"N = {args.samples} samples, B = {args.batch} ({args.scaling} scaling)\n")
print(markdown_table(TABLE_HEADERS, table_rows(points)))
print("\ndistribution pays iff T_sync/T_comp < R - 1 (seed 003)")

args.plot.parent.mkdir(parents=True, exist_ok=True)
print(f"plot written to {plot_scaling(points, args.plot, sync.describe())}")
