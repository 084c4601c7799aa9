"""The data's periodic upkeep (the beat runs both)."""

from __future__ import annotations

from celery import shared_task

from lifecycle import partitions, retention


@shared_task(name="lifecycle.ensure_partitions", ignore_result=True)
def ensure_partitions() -> None:
    """Make the coming days' partitions (and move rows out of a default partition);
    idempotent."""
    partitions.ensure_partitions()


@shared_task(name="lifecycle.apply_retention", ignore_result=True)
def apply_retention() -> None:
    """Export, then drop the days past retention that the export covered; idempotent.
    Run by the reports worker (queue REPORTS_QUEUE), which exports for the reports."""
    retention.apply_retention()
