"""The Celery application, configured from Django settings (the CELERY_ namespace)."""

import os

from celery import Celery
from celery.signals import task_prerun, worker_process_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect  # the solo pool runs tasks in the main process
@worker_process_init.connect  # prefork children
def keep_database_connections(**_) -> None:
    """Workers keep their database connections between tasks. Django's default (a
    connection per request) suits the web server, but a tree hop lasts a few
    milliseconds and opening a connection costs about as much again."""
    from django.conf import settings
    from django.db import connections

    for alias in connections:
        connections[alias].settings_dict["CONN_MAX_AGE"] = settings.WORKER_CONN_MAX_AGE_S


@task_prerun.connect
def drop_broken_or_old_connections(**_) -> None:
    """Before each task, close connections that failed, are too old or no longer answer
    (CONN_HEALTH_CHECKS): a restarted PostgreSQL costs one reconnection, not one task."""
    from django.db import close_old_connections

    close_old_connections()
