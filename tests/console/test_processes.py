"""The console's processes announce themselves in Redis, and the health page lists
them by host: late ones, two beats, the reports worker judged by its run's heartbeat,
and an honest "unknown" while Redis is down."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console import processes
from console.health import redis_client
from console.processes import KEY_PREFIX, Role, announce_once
from reports.models import ReportRun
from tests.cast import log_in_proved

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_announcements")]


def listed() -> list[dict]:
    """The processes as the health page has them, each with its host."""
    found = processes.processes_now()
    assert not found.unknown, found.unknown
    return [{"host": host, **vars(row)} for host, rows in found.by_host.items() for row in rows]


def test_an_announced_tree_worker_is_listed_with_its_host_and_dispatchers(
    client, operator, settings
):
    settings.HOST_NAME = "worker-host-1"
    announce_once(Role.TREE_WORKER, serves=["dispatcher.d0.0", "dispatcher.d0.0.1"])
    [worker] = listed()
    assert worker["host"] == "worker-host-1" and worker["role"] == "tree worker"
    assert worker["serves"] == "dispatcher.d0.0, dispatcher.d0.0.1"
    assert worker["beat_age_s"] < 5 and not worker["late"]
    log_in_proved(client, operator)
    page = client.get("/healthz", HTTP_HX_REQUEST="true").content.decode()
    assert f'data-process="worker-host-1/tree worker/{worker["pid"]}"' in page


def test_the_public_health_json_does_not_tell_hosts_and_processes(client):
    announce_once(Role.TREE_WORKER, serves=["dispatcher.d0.0"])
    assert set(client.get("/healthz.json").json()) == {"ok", "checks"}


def test_a_process_that_stopped_beating_is_late_and_then_gone(monkeypatch):
    announce_once(Role.WEB)
    later = processes.time.time() + processes.LATE_AFTER_S + 1
    monkeypatch.setattr(processes.time, "time", lambda: later)
    [web] = listed()
    assert web["late"]
    ttl = redis_client().ttl(next(redis_client().scan_iter(f"{KEY_PREFIX}*")))
    assert 0 < ttl <= processes.LIVES_S  # Redis forgets it after LIVES_S


def test_two_beats_are_told_on_the_health_page(client, operator, settings):
    log_in_proved(client, operator)
    announce_once(Role.BEAT)
    settings.HOST_NAME = "another-host"
    announce_once(Role.BEAT)
    page = client.get("/healthz", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-beats="2"' in page
    assert "every periodic task runs 2 times as often" in page


def test_the_reports_worker_is_judged_by_its_runs_heartbeat_while_it_runs(monkeypatch):
    announce_once(Role.REPORTS_WORKER, serves=["local[*]"])
    now = timezone.now()
    run = ReportRun.objects.create(
        kind="reach", window_start=now - timedelta(days=1), window_end=now,
        requested_by="test", state=ReportRun.State.RUNNING, started_at=now,
        heartbeat_at=now,
    )  # fmt: skip
    # The process's own beats stopped long ago, but the run's heartbeat is fresh.
    later = processes.time.time() + 60
    monkeypatch.setattr(processes.time, "time", lambda: later)
    run.heartbeat_at = timezone.now() + timedelta(seconds=58)
    run.save(update_fields=["heartbeat_at"])
    [worker] = listed()
    assert not worker["late"] and worker["serves"] == "local[*]"
    assert worker["detail"].startswith(f"running the reach report (run {run.pk}")


def test_with_redis_down_the_processes_are_unknown_and_the_page_still_answers(
    client, operator, monkeypatch
):
    log_in_proved(client, operator)
    monkeypatch.setattr(processes, "redis_client", lambda: unreachable_redis())
    page = client.get("/healthz", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-processes="unknown"' in page and "Redis cannot be reached" in page


def test_no_announcement_says_how_processes_appear(client, operator):
    log_in_proved(client, operator)
    page = client.get("/healthz", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-processes="none"' in page


def unreachable_redis():
    import redis

    return redis.Redis(unix_socket_path="/nonexistent/redis.sock", socket_connect_timeout=0.1)


def test_a_running_tree_worker_announces_the_dispatchers_it_serves(celery_worker):
    from tests.broker.agent_helpers import wait_for

    def tree_workers() -> list[dict]:
        pid = celery_worker.process.pid
        return [p for p in listed() if p["role"] == "tree worker" and p["pid"] == pid]

    wait_for(tree_workers, "the tree worker's announcement", timeout_s=15)
    [worker] = tree_workers()
    assert "dispatcher.d0" in worker["serves"].split(", ") and not worker["late"]
