"""The Celery application, configured from Django settings (the CELERY_ namespace)."""

import os

from celery import Celery
from celery.signals import task_prerun

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
