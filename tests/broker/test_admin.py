"""The project's records in the admin: support staff can read every list and record,
nobody can add, change or delete anything there (changes go through the services)."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from broker.dispatch.summary import Summary
from broker.models import (
    ArchivedEvent,
    Client,
    Delivery,
    Dispatcher,
    DispatcherSummary,
    Event,
    ReceiverStream,
    SummaryVersion,
    TrafficRecord,
    TrafficWatermark,
)
from broker.services.clients import issue_token
from broker.services.events import publish_event
from broker.services.operators import issue_operator_token
from broker.services.presence import session_opened
from demo.scenario import load_scenario
from tests.broker.agent_helpers import ISSUER
from tests.cast import OPERATOR, create_member
from tests.module_data import written_for_the_module

pytestmark = pytest.mark.django_db

BROKER_MODELS = list(apps.get_app_config("broker").get_models())
# Session, user, count(s), the page's rows, and the filters' choices: four to seven
# queries, however many rows the page shows (the fixture's lists have five or more).
MOST_QUERIES_PER_LIST = 8
RECORDS_OF_EACH_KIND = 5


@pytest.fixture(scope="module")
def records(django_db_setup, django_db_blocker):
    """The scenario with a dozen servers, events delivered to them with their hops, and
    at least RECORDS_OF_EACH_KIND records of every other kind; written once for the
    module, whose tests only read them."""
    with written_for_the_module(django_db_blocker):
        yield _records(create_member(OPERATOR))


def _records(operator):
    scenario = load_scenario(servers=12)
    servers = list(Client.objects.filter(model__name="web-server"))
    for index in range(RECORDS_OF_EACH_KIND):
        event = publish_event(
            sender=scenario.controllers["intellimune-national"],
            content={"kind": "command", "action": "disable-cgi"},
            channel=f"commands-{index}",
            actor=ISSUER,
        )
        _deliver(event, servers, position=index + 1)
        issue_token(client=servers[index], actor=ISSUER)
        issue_operator_token(user=operator, label=f"soar-{index}", actor=ISSUER)
    ReceiverStream.objects.bulk_create(ReceiverStream(client=s, last_position=5) for s in servers)
    for server in servers:
        session_opened(client_id=server.pk, peer="127.0.0.1:40000")
    DispatcherSummary.objects.bulk_create(
        DispatcherSummary(dispatcher=d, version=1, data=Summary().to_json())
        for d in Dispatcher.objects.all()
    )
    SummaryVersion.objects.bulk_create(
        SummaryVersion(dispatcher=d, version=1, data=Summary().to_json())
        for d in Dispatcher.objects.all()
    )
    TrafficWatermark.objects.create(last_entry="1790000000000-0")
    ArchivedEvent.objects.create(
        event=Event.objects.first(), archived_at=timezone.now(), counts=[["acked", "eu", "d0", 3]]
    )
    return scenario


def _deliver(event: Event, servers: list[Client], *, position: int) -> None:
    """Deliveries and hops as the tree records them (the tree is tested elsewhere)."""
    now = timezone.now()
    Delivery.objects.bulk_create(
        Delivery(
            event=event, receiver=server, sender=event.sender, channel=event.channel,
            sequence=event.sequence, expires_at=event.expires_at, position=position,
            delivered_at=now,
        )
        for server in servers
    )  # fmt: skip
    TrafficRecord.objects.bulk_create(
        TrafficRecord(event=event, dispatcher=server.dispatcher, direction="down", at=now)
        for server in servers
    )


def _url(model, view: str, *args) -> str:
    return reverse(f"admin:broker_{model._meta.model_name}_{view}", args=args)


def test_every_model_of_the_broker_is_registered():
    assert set(BROKER_MODELS) <= set(admin.site._registry)


@pytest.mark.parametrize("model", BROKER_MODELS, ids=lambda m: m.__name__)
def test_a_superuser_opens_each_list_in_a_few_queries_whatever_its_length(
    admin_client, records, model
):
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(_url(model, "changelist"))
    assert response.status_code == 200
    assert len(queries) <= MOST_QUERIES_PER_LIST, [q["sql"] for q in queries]


@pytest.mark.parametrize("model", BROKER_MODELS, ids=lambda m: m.__name__)
def test_a_superuser_reads_a_record_but_cannot_add_change_or_delete_it(
    admin_client, records, model
):
    record = model._default_manager.first()
    assert record is not None, "the fixture leaves a record of every kind"
    before = model._default_manager.filter(pk=record.pk).values().get()
    assert admin_client.get(_url(model, "add")).status_code == 403
    assert admin_client.get(_url(model, "change", record.pk)).status_code == 200
    assert admin_client.post(_url(model, "change", record.pk), {}).status_code == 403
    assert admin_client.post(_url(model, "delete", record.pk), {"post": "yes"}).status_code == 403
    assert model._default_manager.filter(pk=record.pk).values().get() == before


def test_a_clients_page_does_not_show_its_secrets_hash(admin_client, records):
    server = Client.objects.filter(model__name="web-server").first()
    page = admin_client.get(_url(Client, "change", server.pk)).content.decode()
    assert server.secret_hash not in page
