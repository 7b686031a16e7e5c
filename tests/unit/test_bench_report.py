"""Benchmark plumbing that needs no processes: sizes, units, tables, bandwidth factors."""

from mpi_sgd.bench.allreduce import bus_factor, sizes
from mpi_sgd.report import human_bytes, markdown_table
from mpi_sgd.timing import osu_iterations, passes


def test_sizes_are_powers_of_two_inclusive():
    assert sizes(4, 64) == [4, 8, 16, 32, 64]
    assert sizes(1000, 4096) == [1024, 2048, 4096]
    assert sizes(1024, 64 << 20)[-1] == 64 << 20


def test_human_bytes():
    assert [human_bytes(n) for n in (4, 1024, 3 << 20, 1 << 30)] == ["4 B", "1 KiB", "3 MiB", "1 GiB"]


def test_bus_factor_matches_nccl_tests():
    assert bus_factor(1) == 0.0 and bus_factor(2) == 1.0 and bus_factor(4) == 1.5


def test_osu_defaults():
    assert osu_iterations(8192) == (1000, 100) and osu_iterations(8193) == (100, 10)


def test_markdown_table_aligns_and_marks_missing():
    text = markdown_table(["size", "t"], [["1 KiB", 1.5], ["2 KiB", float("nan")]])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1 and lines[1].startswith("|--") and "-" in lines[3]


def test_numbers_keep_three_digits_below_ten_tenths_below_a_thousand_and_units_above():
    cells = markdown_table(["t"], [[0.012345], [9.876], [123.45], [999.94], [4567.8], [-1234.4]]).splitlines()[2:]
    assert [c.strip("| ") for c in cells] == ["0.0123", "9.88", "123.5", "999.9", "4568", "-1234"]


def test_sgd_variants_expand_the_bucket_sweep():
    from mpi_sgd.bench.sgd import label, variants

    pairs = variants(["flat", "bucketed", "local"], [0.5, 4.0])
    assert pairs == [("flat", None), ("bucketed", 0.5), ("bucketed", 4.0), ("local", None)]
    assert [label(v, mb, sweep=True) for v, mb in pairs] == ["flat", "bucketed 0.5MB", "bucketed 4MB", "local"]
    assert label("bucketed", 1.0, sweep=False) == "bucketed"


def test_passes_put_the_named_implementations_after_the_rest_in_order():
    assert passes(["raw", "gloo", "seam", "memcpy"], {"gloo"}) == [["raw", "seam", "memcpy"], ["gloo"]]
    assert passes(["raw", "seam"], {"gloo"}) == [["raw", "seam"]]  # no empty group
    assert passes(["gloo"], {"gloo", "nccl"}) == [["gloo"]]


def test_allreduce_tables_fit_120_columns_with_every_implementation():
    from mpi_sgd.bench.allreduce import IMPLS, derived_table, summary_table

    # The slowest plausible times (64 MiB over gloo takes tenths of a second: six digits of us)
    rows = [
        dict(bytes=b, impl=i, avg_s=0.4567 * b / (64 << 20) + 1e-6, busbw_GBps=12.3, wrong=w)
        for b in (4, 1 << 20, 64 << 20)
        for i, w in zip(IMPLS, range(len(IMPLS)), strict=True)
    ]
    times, derived = summary_table(rows, IMPLS), derived_table(rows, IMPLS)
    assert max(len(line) for table in (times, derived) for line in table.splitlines()) <= 120
    header = [c.strip() for c in times.splitlines()[0].strip("|").split("|")]
    assert header == ["size", *IMPLS]
    last = [c.strip() for c in derived.splitlines()[-1].strip("|").split("|")]
    assert last[0] == "64 MiB" and last[-1] == str(sum(range(len(IMPLS))))  # wrong results of all implementations
    assert float(last[1]) == 1.0  # raw/seam: the same made-up time
