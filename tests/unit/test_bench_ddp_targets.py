"""bench sgd's verdicts for ddp-mpi4py, from rows made up here: no processes, no timing."""

from mpi_sgd.bench.sgd import targets


def rows(local, bucketed, gloo, ours, model="mlp"):
    steps = {"local": local, "bucketed": bucketed, "ddp-gloo": gloo, "ddp-mpi4py": ours}
    return [{"model": model, "variant": v, "step_s": s, "exposed_s": s - local} for v, s in steps.items()]


def test_both_targets_met():
    # exposed: 11 - 8 = 3 ms against 19 - 8 = 11 ms (0.27x); step 11 vs 10.5 ms (1.05x)
    (line,) = targets(rows(0.008, 0.0105, 0.019, 0.011))
    assert "0.27x (target <= 0.35x: met)" in line and "1.05x (target <= 1.1x: met)" in line


def test_targets_missed_are_said_so():
    (line,) = targets(rows(0.008, 0.010, 0.019, 0.014))  # 6/11 = 0.55x, 1.4x
    assert "0.55x (target <= 0.35x: NOT met)" in line and "1.40x (target <= 1.1x: NOT met)" in line


def test_no_verdict_without_every_variant_it_needs():
    partial = [r for r in rows(0.008, 0.010, 0.019, 0.011) if r["variant"] != "bucketed"]
    assert targets(partial) == []
    # one line per model that has them all
    assert len(targets(rows(0.008, 0.01, 0.019, 0.011) + rows(0.004, 0.005, 0.009, 0.005, "simplenet"))) == 2
