"""The Celery application, configured from Django settings (the CELERY_ namespace)."""

import os
import threading

from celery import Celery
from celery.signals import (
    beat_init,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from console.runtime import tune_garbage_collector

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


def _consumed_queues() -> list[str]:
    return list(app.amqp.queues.consume_from or {})


@worker_process_init.connect
def route_hops_in_each_pool_process(**_) -> None:
    """A tree worker's every pool process routes hops (broker/dispatch/consumer.py)
    beside its tasks: hops use as many cores as the worker has processes."""
    from broker.dispatch.consumer import start_consumer

    tune_garbage_collector()
    start_consumer(_consumed_queues())


@worker_ready.connect
def route_hops_in_a_single_process_worker(sender=None, **_) -> None:
    """A worker without a process pool (solo, threads) routes hops in its own process."""
    if sender is None or "prefork" in type(sender.pool).__module__:
        return
    from broker.dispatch.consumer import start_consumer

    tune_garbage_collector()
    start_consumer(_consumed_queues())


@worker_ready.connect
def announce_the_worker(sender=None, **_) -> None:
    """On the health page: the reports worker with its Spark master, a tree worker with
    the dispatchers whose queues it consumes."""
    from django.conf import settings

    from console.processes import Role, announce_forever

    queues = _consumed_queues()
    if settings.REPORTS_QUEUE in queues:
        announce_forever(Role.REPORTS_WORKER, serves=[settings.SPARK_MASTER])
        return
    dispatchers = sorted(queue for queue in queues if queue.startswith("dispatcher."))
    announce_forever(Role.TREE_WORKER, serves=dispatchers)


@beat_init.connect
def announce_the_beat(**_) -> None:
    """On the health page, where two beats (each schedule run twice) are told."""
    from console.processes import Role, announce_forever

    announce_forever(Role.BEAT)


@worker_process_shutdown.connect
@worker_shutdown.connect
def stop_routing_hops(**_) -> None:
    from broker.dispatch.consumer import stop_consumer

    stop_consumer()
