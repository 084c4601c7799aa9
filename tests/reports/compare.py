"""Two results of one report compared field by field: a Spark job's against the
single-process baseline's (bench/reports_baseline.py), which computes the same figures
with another engine, so floats may differ in their last digits."""

from __future__ import annotations

import math

from reports.results import Result

TOLERANCE = 1e-9


def differences(spark: Result, baseline: Result) -> list[str]:
    """What differs, in words: the summary, and each section row by row."""
    found = []
    if not same(spark.summary, baseline.summary):
        found.append(f"summary: Spark {spark.summary} | baseline {baseline.summary}")
    for name in sorted(spark.sections.keys() | baseline.sections.keys()):
        ours, theirs = spark.sections.get(name, []), baseline.sections.get(name, [])
        if len(ours) != len(theirs):
            found.append(f"{name}: Spark {len(ours)} rows | baseline {len(theirs)}")
        found += [
            f"{name}[{index}]: Spark {row} | baseline {other}"
            for index, (row, other) in enumerate(zip(ours, theirs, strict=False))
            if not same(row, other)
        ]
    return found


def same(value, other) -> bool:
    """Equal; floats to TOLERANCE, in dicts and lists too."""
    if isinstance(value, dict) and isinstance(other, dict):
        return value.keys() == other.keys() and all(same(value[k], other[k]) for k in value)
    if isinstance(value, list | tuple) and isinstance(other, list | tuple):
        return len(value) == len(other) and all(map(same, value, other))
    if isinstance(value, float) or isinstance(other, float):
        if value is None or other is None:
            return value is other
        return math.isclose(value, other, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    return value == other
