"""``mpi-sgd bench async``'s table and verdicts, from job results made up here."""

from __future__ import annotations

from mpi_sgd.bench.asyncsgd import summarize, verdicts


def job(scenario: str, ranks: int, t_sync: list[float], t_async: list[float]) -> dict:
    run = lambda t, loss: {"seconds": t, "final_loss": loss, "curve": [(0, 0, 2.3), (t, 100, loss)]}  # noqa: E731
    return {
        "scenario": scenario,
        "ranks": ranks,
        "runs": {
            "sync": [run(t, 1.0) for t in t_sync],
            "async": [run(t, 1.2) | {"staleness": {"0": 3, "2": 1}} for t in t_async],
        },
    }


def test_rows_take_medians_over_rounds_and_pool_staleness():
    row = summarize(job("base", 3, [2.0, 4.0], [1.0, 3.0]))
    assert row == ("base", 3, 3.0, 2.0, 2.0 / 3.0, 1.0, 1.2, 0.5, 2)


def test_verdicts_compare_what_happened_with_what_should():
    rows = [
        summarize(job("base", 2, [1, 1], [2, 2])),
        summarize(job("base", 3, [1, 1], [0.5, 0.5])),
        summarize(job("straggler", 3, [1, 1], [2, 2])),
        summarize(job("comm", 3, [1, 1], [3, 3])),
    ]
    lines = verdicts(rows)
    assert lines[0].startswith("base R=2: expected async slower; as expected: async slower (2.00x")
    assert lines[1] == "base R=3: async faster (0.50x the sync time)"  # no expectation at R = 3
    assert lines[2].startswith("straggler R=3: expected async faster; not as the model expects, here: async slower")
    assert lines[3].startswith("comm R=3: expected async slower; as expected")
