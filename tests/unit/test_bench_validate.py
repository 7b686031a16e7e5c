"""The pure parts of ``mpi-sgd bench validate``: prediction assembly, the measured step, the verdicts."""

import pytest

from mpi_sgd import perfmodel as pm
from mpi_sgd.bench import validate
from tests.helpers import prints_usage_errors


def test_assemble_is_the_weak_scaling_model():
    # T_comp 2 ms alone, 3 ms with two ranks at once; the all-reduce 1 ms at R = 2, nothing at R = 1.
    rows = validate.assemble(4, {1: 2e-3, 2: 3e-3}, pm.FixedSync(1e-3), {1: 2e-3, 2: 5e-3})
    one, two = rows
    assert (one.t_step, two.t_step) == (pytest.approx(2e-3), pytest.approx(4e-3))
    assert two.pred_speedup == pytest.approx(2 * 2e-3 / 4e-3)  # exactly break-even: does not pay
    assert two.meas_speedup == pytest.approx(2 * 2e-3 / 5e-3)
    assert not two.pred_pays and not two.meas_pays and not one.pred_pays
    assert two.error == pytest.approx(4 / 5 - 1)  # negative: the model was optimistic


def test_assemble_with_the_allreduce_cost_and_without_one_rank():
    net = pm.Network(1e-6, 1e-9, 0.0)
    sync = pm.AllreduceSync(net, 8 << 20)
    rows = validate.assemble(256, {1: 0.05, 2: 0.05}, sync, {1: 0.05, 2: 0.06})
    assert rows[0].t_sync == 0 and rows[1].t_sync == pytest.approx(net.time(pm.ring_allreduce(8 << 20, 2)))
    assert rows[1].pred_pays
    with pytest.raises(ValueError, match="R = 1"):
        validate.assemble(1, {2: 1.0}, sync, {2: 1.0})


def _row(batch, ranks, pred, meas, pred_speedup, meas_speedup):
    return validate.Row(batch, ranks, pred, 0.0, meas, pred_speedup, meas_speedup)


def test_verdicts_met():
    rows = [
        _row(1, 1, 1.0, 1.05, 1, 1),
        _row(1, 2, 2.5, 2.4, 0.8, 0.85),
        _row(512, 1, 1.0, 0.95, 1, 1),
        _row(512, 2, 1.08, 1.0, 1.8, 1.9),
    ]
    lines = validate.verdicts(rows)
    assert [line.split(":")[0] for line in lines] == ["met", "met"]


def test_verdicts_print_every_miss_and_judge_only_targeted_ranks():
    rows = [
        _row(1, 1, 1.0, 1.5, 1, 1),
        _row(1, 2, 2.5, 2.4, 0.8, 1.2),
        _row(512, 1, 1.0, 1.0, 1, 1),
        _row(512, 2, 1.05, 1.0, 1.8, 1.9),
        _row(512, 4, 1.0, 3.0, 3.0, 1.2),
    ]
    accuracy, side, untargeted = validate.verdicts(rows)
    assert accuracy.startswith("MISSED") and "B=1 R=1 -33.3%" in accuracy and "R=4" not in accuracy
    assert side.startswith("MISSED") and "wrong side beyond the spread: B=1 R=2" in side
    assert untargeted.startswith("reported, not targeted: R = 4") and "-66.7%" in untargeted


def test_verdicts_want_one_configuration_on_each_side():
    rows = [_row(1, 1, 1.0, 1.0, 1, 1), _row(1, 2, 1.5, 1.5, 1.3, 1.3)]
    assert validate.verdicts(rows)[1] == (
        "MISSED: a configuration on each side of break-even (all predicted on the paying side)"
    )


def test_row_rejects_nonsense():
    with pytest.raises(ValueError):
        _row(1, 2, 1.0, 0.0, 1.0, 1.0)


def test_measured_step_is_the_slowest_rank_per_step_after_warm_up():
    metrics = {
        "warmup_steps": 1,
        "t_comp": [[9.0, 1.0, 1.0, 2.0], [9.0, 2.0, 1.0, 1.0]],
        "t_sync": [[9.0, 1.0, 1.0, 0.5], [9.0, 0.0, 0.5, 0.5]],
    }
    median, mean = validate.step_seconds(metrics)  # per step: 18 (warm-up), 2, 2, 2.5
    assert median == 2.0 and mean == pytest.approx(6.5 / 3)


def test_parser_errors_exit_2(capsys):
    from mpi_sgd.cli import main

    for argv in (["--ranks", "2,4"], ["--max-steps", "5"], ["--batches", "2048"]):
        with pytest.raises(SystemExit) as e:
            main(["bench", "validate", *argv])
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert ("--ranks must include 1 and 2" in err) if prints_usage_errors() else err == ""  # rank 0 speaks for all


def _repeats(measured_r2: list[float], pred_r2: float = 2.5, batch: int = 1):
    """Repeats of one configuration: 1 s alone, ``pred_r2`` predicted at R = 2, measured as given."""
    return [[_row(batch, 1, 1.0, 1.0, 1, 1), _row(batch, 2, pred_r2, m, 2 / pred_r2, 2 / m)] for m in measured_r2]


def test_summarize_gives_median_and_extremes_over_repeats():
    (one, two) = validate.summarize(_repeats([2.0, 2.5, 3.0]))
    assert two.measured == (2.0, 2.5, 3.0) and two.t_step == (2.5, 2.5, 2.5)
    assert two.error == pytest.approx((2.5 / 3.0 - 1, 0.0, 2.5 / 2.0 - 1))  # extremes pair up
    assert two.meas_speedup == pytest.approx((2 / 3.0, 0.8, 1.0)) and two.meas_pays is False
    assert one.pred_pays is False and one.error == (0.0, 0.0, 0.0)


def test_a_spread_that_straddles_a_line_is_inconclusive_not_a_verdict():
    # measured speedup 2/1.8 = 1.11 in one repeat, 2/2.6 = 0.77 in another: which side is unknown
    spreads = validate.summarize(_repeats([1.8, 2.6, 2.5]) + _repeats([0.5, 0.5, 0.5], pred_r2=0.5, batch=512))
    accuracy, side = validate.verdicts(spreads)
    assert accuracy.startswith("inconclusive") and "B=1 R=2" in accuracy
    assert side.startswith("inconclusive") and "spread straddles 1: B=1 R=2" in side
    assert "?" in validate.table(spreads) and "2500.00 (1800.00..2600.00)" in validate.table(spreads)


def test_wrong_side_beyond_the_spread_is_a_miss():
    # predicted 2.5 s at R = 2 (speedup 0.8) every time; measured 1.5-1.7 s (speedup > 1) every time
    spreads = validate.summarize(_repeats([1.5, 1.6, 1.7]) + _repeats([0.5, 0.5, 0.5], pred_r2=0.5, batch=512))
    side = validate.verdicts(spreads)[1]
    assert side.startswith("MISSED") and "wrong side beyond the spread: B=1 R=2" in side


def test_the_table_fits_120_columns_with_spreads_as_two_tables_of_the_same_rows():
    spreads = validate.summarize(_repeats([1800.0, 2600.0, 2500.0], batch=65536))
    text = validate.table(spreads)
    assert max(len(line) for line in text.splitlines()) <= 120
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    assert [r[2] for r in rows if r[0] == "config"] == ["pred step (ms)", "pred T_sync/T_comp"]
    assert text.count("B=65536") == 4  # R = 1 and 2, in each table


def test_a_calibration_sweep_refused_for_noise_is_swept_once_more(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from mpi_sgd.launch import JobFailed

    calls = []

    def run(ranks, transport, *argv):
        calls.append(argv)
        if len(calls) == 1:
            raise JobFailed(
                ["mpiexec"], 2, "error: the all-reduces up to 1 MiB showed no cost per byte above the noise"
            )

    monkeypatch.setattr(validate, "_run", run)
    monkeypatch.setattr("mpi_sgd.calibrate.Calibration.load", staticmethod(lambda path: "loaded"))
    args = SimpleNamespace(out_dir=tmp_path, max_bytes=1 << 20, transport="shm")
    assert validate.calibrate(8, 2, args) == "loaded" and len(calls) == 2 and calls[0] == calls[1]
    assert "sweeping once more" in capsys.readouterr().out
    calls.clear()
    monkeypatch.setattr(validate, "_run", lambda *a: (_ for _ in ()).throw(JobFailed(["mpiexec"], 1, "Traceback")))
    with pytest.raises(JobFailed):  # any other failure is not retried
        validate.calibrate(8, 2, args)


def test_a_failed_job_under_the_cli_is_its_output_not_a_traceback(monkeypatch, capsys):
    from mpi_sgd import cli
    from mpi_sgd.launch import JobFailed

    def failing(namespace):
        raise JobFailed(["mpiexec", "-n", "2"], 2, "error: refused\n")

    monkeypatch.setattr(cli, "run_command", failing)
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mpi-sgd: mpiexec -n 2 failed (exit 2):\nerror: refused") and "Traceback" not in err
