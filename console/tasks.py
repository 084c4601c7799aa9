"""Celery tasks of the console itself (the broker's tasks live in broker/tasks.py)."""

from celery import shared_task

from console import health


@shared_task(name=health.ECHO_TASK, ignore_result=True)
def health_echo(token: str) -> None:
    """Answer a health probe: mark `token` as seen by a worker. Idempotent."""
    health.record_worker_echo(token)
