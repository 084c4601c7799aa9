"""Audit and incident reports: the Parquet export, the Spark jobs and their stored
results (docs/reports.md)."""

# The Celery queue of the reports worker (the launcher starts it; settings name it).
QUEUE = "reports"
