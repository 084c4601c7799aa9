"""`/metrics`: Prometheus' text format for holders of an operator API token whose role
may read the fleet, with the service's figures read as it is scraped."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from broker.api import token_failures_key
from broker.audit import Actor
from broker.dispatch import latency, transport
from broker.services.operators import issue_operator_token
from console.metrics import DELIVERY_COUNTS_KEY
from console.processes import Role, announce_once
from reports.models import ReportRun
from tests.cast import AUDITOR, Member, create_member

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

ISSUER = Actor("test", "metrics")
PROMETHEUS = "192.0.2.7"


@pytest.fixture(autouse=True)
def fresh_counts():
    cache.delete(DELIVERY_COUNTS_KEY)
    yield
    cache.delete(token_failures_key(PROMETHEUS))


def scrape(client, token: str | None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get("/metrics", REMOTE_ADDR=PROMETHEUS, **headers)


def samples(response) -> dict[tuple[str, tuple], float]:
    return samples_of(response.content.decode())


def samples_of(text: str) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_without_a_valid_token_metrics_are_refused_401_with_a_bearer_challenge(client):
    for token in (None, "sno_not-a-token", "snt_a-client-token"):
        refused = scrape(client, token)
        assert refused.status_code == 401
        assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert "sn_" not in refused.content.decode()


def test_an_operator_whose_role_may_not_read_the_fleet_is_refused_403(client):
    nobody = create_member(Member("nora", "nora-has-no-role-42", role=""))
    refused = scrape(client, issue_operator_token(user=nobody, label="x", actor=ISSUER))
    assert refused.status_code == 403


def finished_run(kind: str, seconds: float) -> None:
    started = timezone.now() - timedelta(hours=1)
    ReportRun.objects.create(
        kind=kind, window_start=started - timedelta(days=1), window_end=started,
        requested_by="test", state=ReportRun.State.DONE, started_at=started,
        finished_at=started + timedelta(seconds=seconds),
    )  # fmt: skip


def test_an_auditors_token_reads_deliveries_agents_dispatchers_and_report_runs(client, settings):
    settings.HOST_NAME = "metrics-host"
    announce_once(Role.BEAT)
    finished_run("reach", 12.0)
    finished_run("reach", 40.0)
    auditor = create_member(AUDITOR)
    response = scrape(client, issue_operator_token(user=auditor, label="prometheus", actor=ISSUER))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    found = samples(response)
    for state in ("pending", "delivered", "acked", "failed", "expired"):
        assert found[("sn_deliveries", (("state", state),))] == 0
    assert found[("sn_agents_connected", ())] == 0
    assert found[("sn_dispatcher_hops_waiting", (("dispatcher", "dispatcher.d0"),))] >= 0
    assert ("sn_hops_set_aside", ()) in found
    reach = (("kind", "reach"), ("state", "done"))
    assert found[("sn_processes", (("host", "metrics-host"), ("role", "beat")))] >= 1
    assert found[("sn_report_run_seconds_count", reach)] == 2
    assert found[("sn_report_run_seconds_sum", reach)] == 52.0
    assert found[("sn_report_run_seconds_bucket", tuple(sorted((*reach, ("le", "20.0")))))] == 1


def test_with_the_database_down_a_scrape_is_503_not_a_failure(client, monkeypatch):
    from django.db import OperationalError

    from console.views import metrics as view

    def down(request):
        raise OperationalError("connection failed")

    monkeypatch.setattr(view, "_figures_for_a_reader", down)
    assert scrape(client, "sno_whatever").status_code == 503


def test_routed_hops_are_timed_from_their_arrival_for_the_whole_deployment(client):
    redis = transport.broker_redis()
    left_over = list(redis.scan_iter(f"{latency.KEY_PREFIX}*"))
    if left_over:  # DEL with no key is an error, and a fresh Redis has none
        redis.delete(*left_over)
    pipeline = redis.pipeline()
    leaf = "sn-tree:hops:dispatcher.d0.1.0"
    arrivals = [(leaf, b"1800000000000-0"), (leaf, b"1799999999000-1")]  # 0.25 s, 1.25 s
    latency.record(pipeline, arrivals, now_s=1_800_000_000.25)
    latency.record(pipeline, [("sn-tree:hops:dispatcher.d0", b"1800000000250-0")],
                   now_s=1_800_000_000.25)  # fmt: skip
    pipeline.execute()
    auditor = create_member(AUDITOR)
    token = issue_operator_token(user=auditor, label="prometheus", actor=ISSUER)
    found = samples(scrape(client, token))
    leaves = (("level", "2"),)
    assert found[("sn_hop_seconds_count", leaves)] == 2
    assert found[("sn_hop_seconds_sum", leaves)] == pytest.approx(1.5)
    assert found[("sn_hop_seconds_bucket", (("le", "0.25"), ("level", "2")))] == 1
    assert found[("sn_hop_seconds_bucket", (("le", "2.5"), ("level", "2")))] == 2
    assert found[("sn_hop_seconds_bucket", (("le", "0.005"), ("level", "0")))] == 1
