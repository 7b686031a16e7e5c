"""Calibrating from wherever it is called, and ``python -m mpi_sgd.calibrate``, the job that does it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..args import ArgumentParser, flag, layer_widths, nbytes, positive_int
from ..perfmodel import ALLREDUCE_ALGORITHMS
from .fit import SweepRefused
from .measure import calibrate, sweep_sizes
from .records import Calibration


def run_calibration(
    save: str | os.PathLike | None = None,
    max_bytes: int = 16 << 20,
    layers: Sequence[int] | None = None,
    batch_size: int = 64,
    algorithm: str = "ring",
    need_network: bool = True,
    spawn_ranks: int = 2,
    strategy: str = "flat",
    t_comp_only: bool = False,
) -> Calibration | None:
    """Calibrate from wherever this is called; the root gets the result, other ranks ``None``.

    Under mpiexec every rank measures together. As one process that needs α and β, it starts
    ``mpiexec -n spawn_ranks python -m mpi_sgd.calibrate`` and reads back what that job saved;
    as one process that needs only T_comp (the network comes from elsewhere), it measures here.
    """
    from ..launch import JobFailed, placement, run_job

    if placement().size == 1 and need_network:
        import tempfile

        out = Path(save) if save else Path(tempfile.mkdtemp()) / "calibration.json"
        layers_flag = ["--layers", ",".join(map(str, layers))] if layers else []
        flags = ["--max-bytes", str(max_bytes), *layers_flag, "--batch-size", str(batch_size), "--strategy", strategy]
        try:
            run_job(spawn_ranks, "-m", "mpi_sgd.calibrate", "--save", str(out), *flags, "--algorithm", algorithm)
        except JobFailed as e:
            refused = [line for line in e.output.splitlines() if "mpi_sgd.calibrate: error: " in line]
            if e.returncode == 2 and refused:  # the job's own one line (see main), not a crash
                raise SweepRefused(refused[-1].split(": error: ", 1)[1]) from None
            raise
        return Calibration.load(out)
    from ..comm import init

    comm = init("mpi4py")
    cal = calibrate(
        comm, sweep_sizes(max_bytes=max_bytes), layers, batch_size, algorithm, strategy, measure_network=not t_comp_only
    )
    if not comm.is_root:
        return None
    if save:
        cal.save(save)
    return cal


@dataclass(frozen=True)
class Flags:
    save: Path | None = flag(None, "JSON file to write (on the root rank)", Path, required=True)
    max_bytes: int = flag(16 << 20, "largest all-reduce", nbytes)
    layers: list | None = flag(None, "MLP widths to time (default: --model mlp's)", layer_widths)
    batch_size: int = flag(64, "per-rank batch for T_comp", positive_int)
    algorithm: str = flag("ring", "cost formula to fit", choices=ALLREDUCE_ALGORITHMS)
    strategy: str = flag(
        "flat", "gradient layout T_comp is timed with, as sync_sgd's --strategy: naive, flat, bucketed"
    )
    t_comp_only: bool = flag(False, "T_comp and γ only, no all-reduce sweep (the network from another calibration)")

    def __post_init__(self):
        from ..gradsync import STRATEGIES  # torch: imported by a calibration, not by whoever imports this module

        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown --strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")


def main(argv: Sequence[str] | None = None) -> int:
    """``mpiexec -n 2 python -m mpi_sgd.calibrate --save FILE``: measure, and the root saves."""
    parser = ArgumentParser(prog="python -m mpi_sgd.calibrate", description=main.__doc__)
    args = parser.parse_flags(Flags, argv)
    try:
        cal = run_calibration(
            args.save,
            args.max_bytes,
            args.layers,
            args.batch_size,
            args.algorithm,
            need_network=False,
            strategy=args.strategy,
            t_comp_only=args.t_comp_only,
        )
    except SweepRefused as e:  # every rank fitted the same points, so every rank is here
        parser.fail(str(e))
    if cal is not None:
        print(f"{cal.meta['ranks']} rank(s): T_comp {cal.step.seconds * 1e3:.3f} ms; {cal.network.describe()}")
    return 0
