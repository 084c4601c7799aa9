"""The reports benchmark's budgets: the issue's figures, by the size of the data."""

from __future__ import annotations

from bench.reports import arguments, budget_misses, seconds_of

ARGS = arguments(["--sizes", "1000000", "10000000", "--baseline-size", "10000000"])


def figures(first: float, warm: float, window: float, region: float, ratio: float) -> dict:
    runs = [{"run": "whole", "s": first}, {"run": "whole", "s": warm}]
    runs += [{"run": "window", "s": window}, {"run": "region", "s": region}]
    return {"startup_s": 5.0, "runs": runs, "ratio": ratio}


def test_a_million_deliveries_are_held_to_3_s_and_10x_duckdb_in_every_warm_run():
    misses = budget_misses(figures(20, 2.5, 2.9, 3.4, 12.0), 1_000_000, ARGS)

    assert misses == ["region run 3.40 s > 3 s", "12.0x DuckDB's time"]


def test_ten_million_are_held_to_20_s_wherever_duckdb_ran():
    assert budget_misses(figures(40, 12.0, 7.0, 16.0, 30.0), 10_000_000, ARGS) == []
    assert budget_misses(figures(40, 21.0, 7.0, 16.0, 3.0), 10_000_000, ARGS) == [
        "warm run 21.00 s > 20 s"
    ]


def test_a_slow_start_is_over_budget_at_any_size():
    assert budget_misses(figures(178.0, 1, 1, 1, 1), 1_000_000, ARGS) == [
        "start-up and first run 183.0 s"
    ]


def test_the_changed_window_and_region_are_judged_by_their_medians():
    runs = [{"run": "whole", "s": s} for s in (20.0, 1.0, 1.2)]
    runs += [{"run": "window", "s": 3.6}, {"run": "region", "s": 1.0}]
    runs += [{"run": "window", "s": 1.1}, {"run": "region", "s": 3.5}]
    runs += [{"run": "window", "s": 1.2}, {"run": "region", "s": 1.1}]
    found = {"startup_s": 5.0, "runs": runs, "ratio": 2.0}
    assert budget_misses(found, 1_000_000, ARGS) == []
    medians = [seconds_of(found, run) for run in ("first", "warm", "window", "region")]
    assert medians == [20.0, 1.1, 1.2, 1.1]
