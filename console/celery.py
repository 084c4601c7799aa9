"""The Celery application, configured from Django settings (the CELERY_ namespace)."""

import os
import threading

from celery import Celery
from celery.signals import task_prerun, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def drop_broken_or_old_connections(**_) -> None:
    """Before each task, close connections that failed, are too old or no longer answer
    (CONN_HEALTH_CHECKS): a restarted PostgreSQL costs one reconnection, not one task."""
    from django.db import close_old_connections

    close_old_connections()


@worker_ready.connect
def warm_spark_in_the_reports_worker(sender=None, **_) -> None:
    """The worker that serves the reports queue starts Spark as it starts (in the
    background), so that no report waits for it; every report then finds it warm."""
    from django.conf import settings

    consumed = sender.app.amqp.queues.consume_from if sender is not None else {}
    if settings.REPORTS_QUEUE not in (consumed or {}):
        return
    from reports.spark import warm_up

    threading.Thread(target=warm_up, daemon=True, name="spark-warm-up").start()
