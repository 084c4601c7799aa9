"""Fixtures of the benchmarks' tests: the reports' SparkSession and worm incident
(tests/reports/conftest.py), for the reports baseline's test."""

from tests.reports.conftest import spark, worm_incident

__all__ = ["spark", "worm_incident"]
