"""Fixtures of the benchmarks' tests: the reports' worm incident (tests/reports/conftest.py),
for the reports baseline's test (the SparkSession, `spark`, is tests/conftest.py's)."""

from tests.reports.conftest import worm_incident

__all__ = ["worm_incident"]
