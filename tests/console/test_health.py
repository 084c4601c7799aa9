"""Health checks exercise real PostgreSQL, Redis, Celery and the channel layer."""

import pytest
from django.urls import reverse

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


def test_health_json_is_200_with_every_check_and_its_latency(client, celery_worker):
    response = client.get(reverse("health-json"))
    assert response.status_code == 200
    payload = response.json()
    assert payload["ok"] is True
    names = [check["name"] for check in payload["checks"]]
    assert names == ["database", "redis", "celery worker", "channel layer"]
    assert all(check["latency_ms"] >= 0 for check in payload["checks"])


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
