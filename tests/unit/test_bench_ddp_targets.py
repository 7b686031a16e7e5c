"""bench sgd's verdicts for ddp-mpi4py, from rows made up here: no processes, no timing. Each row
carries its interleaved blocks, as bench sgd's do; the ratios are paired block by block."""

from mpi_sgd.bench.sgd import targets

JITTER = (1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97)  # the load of each block, shared by every variant


def rows(local, bucketed, gloo, ours, model="mlp", jitter=JITTER):
    steps = {"local": local, "bucketed": bucketed, "ddp-gloo": gloo, "ddp-mpi4py": ours}
    return [
        {"model": model, "variant": v, "step_s": s, "exposed_s": s - local, "step_blocks": [s * j for j in jitter]}
        for v, s in steps.items()
    ]


def test_both_targets_met():
    # exposed: 11 - 8 = 3 ms against 19 - 8 = 11 ms (0.27x); step 11 vs 10.5 ms (1.05x)
    exposed, step = targets(rows(0.008, 0.0105, 0.019, 0.011))
    assert "exposed communication vs ddp-gloo's: 0.273x [95% CI" in exposed
    assert exposed.endswith("(project target <= 0.35x: met)")
    assert "step vs bucketed: 1.048x [95% CI" in step and step.endswith("(project target <= 1.1x: met)")


def test_simplenet_has_its_own_exposed_target():
    # the same 0.27x meets the MLP's 0.35x and misses SimpleNet's 0.25x
    exposed, _ = targets(rows(0.008, 0.0105, 0.019, 0.011, model="simplenet"))
    assert exposed.startswith("simplenet: ") and exposed.endswith("(project target <= 0.25x: not met here)")


def test_targets_missed_are_said_so():
    exposed, step = targets(rows(0.008, 0.010, 0.019, 0.014))  # 6/11 = 0.55x, 1.4x
    assert exposed.endswith("(project target <= 0.35x: not met here)")
    assert step.endswith("(project target <= 1.1x: not met here)")


def test_a_run_too_noisy_to_tell_is_inconclusive():
    # the same medians, but ddp-mpi4py's blocks alone swing by +-10%: the interval straddles 1.1x
    noisy = rows(0.008, 0.0105, 0.019, 0.011)
    noisy[3]["step_blocks"] = [0.011 * j for j in (1.0, 1.1, 0.9, 1.1, 0.9, 1.0, 1.12, 0.88)]
    _, step = targets(noisy)
    assert step.endswith("(project target <= 1.1x: inconclusive here)")


def test_no_verdict_without_every_variant_it_needs():
    partial = [r for r in rows(0.008, 0.010, 0.019, 0.011) if r["variant"] != "bucketed"]
    assert targets(partial) == []
    # two lines per model that has them all
    assert len(targets(rows(0.008, 0.01, 0.019, 0.011) + rows(0.004, 0.005, 0.009, 0.005, "simplenet"))) == 4


def test_breakdown_splits_the_bucketed_step_into_parts_that_add_up():
    from mpi_sgd.bench.sgd_report import breakdown

    steps = {"local": 10.0, "bucketed": 11.5, "bucketed-alone": 10.6, "unchecked": 11.3, "comm-only": 0.7}
    made = [{"model": "mlp", "variant": v, "step_s": ms / 1e3} for v, ms in steps.items()]
    lines = breakdown(made)
    values = [float(line.split()[-3]) for line in lines]
    # compute 10, own work 0.6, all-reduce 0.7, the rest 11.5 - 10.6 - 0.7 = 0.2; the step; the check's 0.2
    assert values == [10.0, 0.6, 0.7, 0.2, 11.5, 0.2]
    assert round(sum(values[:4]), 3) == values[4]
    assert lines[4].endswith("1.150x local") and all(len(line) <= 120 for line in lines)
    assert len(breakdown([r for r in made if r["variant"] != "unchecked"])) == 5  # no check line
    assert breakdown([r for r in made if r["variant"] != "comm-only"]) == []  # a part missing: no split


def test_breakdown_takes_the_wait_for_the_slower_rank_apart_when_it_was_timed():
    from mpi_sgd.bench.sgd_report import breakdown

    steps = {"local": 10.0, "local-synced": 10.3, "bucketed": 11.5, "bucketed-alone": 10.6, "comm-only": 0.5}
    lines = breakdown([{"model": "mlp", "variant": v, "step_s": ms / 1e3} for v, ms in steps.items()])
    values = [float(line.split()[-3]) for line in lines]
    assert values == [10.0, 0.6, 0.3, 0.5, 0.1, 11.5]  # the rest: 11.5 - 10.6 - 0.5 - 0.3
    assert "slower rank" in lines[2] and round(sum(values[:5]), 3) == values[5]


def test_comm_only_has_no_exposed_time_as_it_is_not_a_step():
    import math

    from mpi_sgd.bench.sgd import TABLE
    from mpi_sgd.bench.sgd_report import add_ratios

    rows = [{"variant": v, "step_s": s} for v, s in (("local", 0.010), ("bucketed", 0.012), ("comm-only", 0.003))]
    by = {r["variant"]: r for r in add_ratios(rows, not_steps={n for n, v in TABLE.items() if v.comm_only})}
    assert by["bucketed"]["exposed_s"] == 0.012 - 0.010 and by["local"]["exposed_s"] == 0
    assert math.isnan(by["comm-only"]["exposed_s"]) and by["comm-only"]["vs_local"] == 0.3
