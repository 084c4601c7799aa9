"""Health checks exercise real PostgreSQL, Redis, Celery and the channel layer."""

import pytest
from django.contrib import auth
from django.db import OperationalError
from django.urls import reverse

from auditchain.services import link_entries, verify_log
from broker.models import AuditEntry
from console import health
from tests.cast import log_in_proved

pytestmark = pytest.mark.django_db


def test_database_check_reports_the_server_version_and_latency():
    result = health.timed_check("database", health.probe_database)
    assert result.ok, result.detail
    assert result.detail.startswith("PostgreSQL")
    assert result.latency_ms > 0


def test_redis_and_channel_layer_checks_make_real_round_trips():
    redis_result = health.timed_check("redis", health.probe_redis)
    layer_result = health.timed_check("channel layer", health.probe_channel_layer)
    assert redis_result.ok, redis_result.detail
    assert layer_result.ok, layer_result.detail
    assert "RedisChannelLayer" in layer_result.detail


def test_worker_check_passes_when_a_worker_runs_the_echo_task(celery_worker):
    result = health.timed_check("celery worker", health.probe_celery_worker)
    assert result.ok, result.detail


def test_worker_check_fails_with_a_reason_when_no_worker_consumes_the_queue():
    result = health.timed_check(
        "celery worker",
        lambda: health.probe_celery_worker(queue="nobody-listens-here", timeout_s=1),
    )
    assert not result.ok
    assert "no worker ran the echo task within 1 s" in result.detail


def test_health_json_is_200_with_each_check_up_by_name_and_nothing_more(client, celery_worker):
    response = client.get(reverse("health-json"))
    assert response.status_code == 200
    assert response.json() == {
        "ok": True,
        "checks": [
            {"name": "database", "ok": True},
            {"name": "redis", "ok": True},
            {"name": "celery worker", "ok": True},
            {"name": "channel layer", "ok": True},
        ],
    }


def test_health_json_tells_no_server_version(client):
    body = client.get(reverse("health-json")).content.decode()
    database_version = health.probe_database()  # e.g. "PostgreSQL 18.1"
    redis_version = health.probe_redis().removeprefix("Redis ")
    assert database_version not in body and "PostgreSQL" not in body
    assert redis_version not in body and "Redis" not in body


def test_a_failing_check_is_503_and_down_without_its_error_text(client, monkeypatch):
    monkeypatch.setattr(health, "probe_redis", failing_with(INTERNAL_ERROR))
    response = client.get(reverse("health-json"))
    assert response.status_code == 503
    checks = {check["name"]: check for check in response.json()["checks"]}
    assert checks["redis"] == {"name": "redis", "ok": False}
    assert "redis.sock" not in response.content.decode()


def test_the_logged_in_page_keeps_each_checks_version_and_error(client, operator, monkeypatch):
    monkeypatch.setattr(health, "probe_redis", failing_with(INTERNAL_ERROR))
    log_in_proved(client, operator)
    body = client.get(reverse("health"), headers={"HX-Request": "true"}).content.decode()
    assert health.probe_database() in body
    assert INTERNAL_ERROR in body
    assert 'data-processes="none"' in body


def test_with_no_login_to_check_the_page_says_up_or_down_only(client, monkeypatch):
    # While PostgreSQL is down, reading the session's user fails: anyone may be asking.
    monkeypatch.setattr(health, "probe_redis", failing_with(INTERNAL_ERROR))
    monkeypatch.setattr(auth, "get_user", unreachable_database)
    response = client.get(reverse("health"))
    body = response.content.decode()
    assert response.status_code == 503
    assert '<tr class="bad" data-check="redis">' in body
    assert '<tr class="ok" data-check="database">' in body
    assert INTERNAL_ERROR not in body and "PostgreSQL" not in body
    assert "data-processes" not in body and "data-health-public" in body


INTERNAL_ERROR = "Error 111 connecting to unix socket: /srv/console/redis.sock"


def failing_with(message: str):
    def probe() -> str:
        raise ConnectionError(message)

    return probe


def unreachable_database(request):
    raise OperationalError("connection to server on socket /srv/pg/.s.PGSQL.5432 failed")


def test_health_page_needs_a_login(client):
    response = client.get(reverse("health"))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_htmx_request_gets_only_the_checks_fragment(client, operator, celery_worker):
    log_in_proved(client, operator)
    response = client.get(reverse("health"), headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in body
    assert 'data-health-state="ok"' in body
    assert body.count('class="ok" data-check=') == 4


def test_full_health_page_starts_pending_and_asks_htmx_for_the_checks(client, operator):
    log_in_proved(client, operator)
    body = client.get(reverse("health")).content.decode()
    assert 'data-health-state="pending"' in body
    assert 'hx-get="/healthz"' in body
    assert 'hx-trigger="load, every 5s"' in body


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_the_logged_in_page_says_whether_the_audit_log_verifies(
    client, operator, settings, tmp_path
):
    settings.SIGNING_KEYS_DIR = str(tmp_path)  # no audit key: no checkpoint expected
    log_in_proved(client, operator)
    checks = lambda: client.get(reverse("health"), headers={"HX-Request": "true"}).content.decode()  # noqa: E731
    assert 'data-audit-chain="unverified"' in checks()
    link_entries()
    verify_log()
    assert 'data-audit-chain="verified"' in checks()
    AuditEntry.objects.filter(pk=AuditEntry.objects.earliest("id").pk).update(reason="edited")
    verify_log()
    assert 'data-audit-chain="broken"' in checks()
