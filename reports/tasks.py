"""Celery tasks of the reports. `run_report` is served by the reports worker only
(queue REPORTS_QUEUE), which keeps a SparkSession warm; the others are periodic and
light, on the default queue."""

from celery import shared_task

from reports import runner, services


@shared_task(name=services.RUN_TASK, ignore_result=True)
def run_report(run_id: int) -> None:
    """Run one report (idempotent: a finished or elsewhere-running report is skipped)."""
    runner.run_report(run_id)


@shared_task(name="reports.schedule", ignore_result=True)
def schedule() -> None:
    """Periodic: every report over the last day."""
    services.schedule_reports()


@shared_task(name="reports.sweep", ignore_result=True)
def sweep() -> None:
    """Periodic: fail the runs whose worker stopped, so no page waits forever."""
    services.sweep_stalled_runs()
