"""The Celery application, configured from Django settings (the CELERY_ namespace)."""

import logging
import os
import threading

from celery import Celery
from celery.signals import (
    beat_init,
    task_prerun,
    worker_init,
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
    """The worker that serves the reports queue starts Spark and reads the dataset
    into memory as it starts (in the background), so that no report waits for either;
    every report then finds them warm."""
    from django.conf import settings

    consumed = sender.app.amqp.queues.consume_from if sender is not None else {}
    if settings.REPORTS_QUEUE not in (consumed or {}):
        return
    threading.Thread(target=_warm_up_reports, daemon=True, name="spark-warm-up").start()


def _warm_up_reports() -> None:
    """The reports worker's warm-up; should it fail (a dataset unreadable now), the
    worker goes on: its first report starts Spark and reads the dataset itself, and
    says what is wrong in that report's error."""
    from django.db import connections

    from reports.runner import warm_up

    try:
        warm_up()
    except Exception:
        logging.getLogger(__name__).exception("the reports worker's warm-up failed")
    finally:
        connections.close_all()  # this thread's own (the export's lock)


# The queues the worker was started with (`--queues`), kept before it takes over any
# (console/takeover.py); its pool processes, forked later, inherit them.
_own_queues: list[str] = []


@worker_init.connect
def keep_the_queues_the_worker_was_started_with(**_) -> None:
    _own_queues[:] = list(app.amqp.queues.consume_from or {})


def _dispatcher_queues() -> list[str]:
    return sorted(queue for queue in _own_queues if queue.startswith("dispatcher."))


def _start_routing_hops() -> None:
    """Route the hops of this worker's dispatchers, and of those it takes over."""
    from broker.dispatch.consumer import start_consumer
    from console.takeover import uncovered_queues

    tune_garbage_collector()
    own = _dispatcher_queues()
    start_consumer(own, also_serve=lambda: uncovered_queues(own))


@worker_process_init.connect
def route_hops_in_each_pool_process(**_) -> None:
    """A tree worker's every pool process routes hops (broker/dispatch/consumer.py)
    beside its tasks: hops use as many cores as the worker has processes."""
    _start_routing_hops()


@worker_ready.connect
def route_hops_in_a_single_process_worker(sender=None, **_) -> None:
    """A worker without a process pool (solo, threads) routes hops in its own process."""
    if sender is None or "prefork" in type(sender.pool).__module__:
        return
    _start_routing_hops()


@worker_ready.connect
def announce_the_worker(sender=None, **_) -> None:
    """On the health page: the reports worker with its Spark master; a tree worker with
    the dispatchers whose queues it consumes, and those it covers for a gone one (it
    consumes their Celery queues too while it does: console/takeover.py)."""
    from django.conf import settings

    from console.processes import Role, announce_forever

    if settings.REPORTS_QUEUE in _own_queues:
        announce_forever(Role.REPORTS_WORKER, serves=[settings.SPARK_MASTER])
        return
    if not _dispatcher_queues() or sender is None:
        return
    from console.takeover import CeleryQueueCover

    cover = CeleryQueueCover(sender, _own_queues)  # worker_ready is sent by the consumer
    cover.run_forever()
    announce_forever(Role.TREE_WORKER, serves=_dispatcher_queues(), covering=lambda: cover.covering)


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


@worker_shutdown.connect
def withdraw_the_announcement(**_) -> None:
    """A worker stopping on purpose says so: its dispatchers are taken over at once."""
    from console.processes import withdraw

    withdraw()
