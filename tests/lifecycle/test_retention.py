"""Partitions made ahead, and retention that loses nothing (lifecycle.partitions,
lifecycle.retention): a day past RETAIN_DAYS is dropped whole only once the reports'
export covered it, its events keep what their deliveries came to, and a day holding
anything of a live event or of rows written since the export is kept and says why."""

from __future__ import annotations

import io
from datetime import timedelta

import pyarrow.dataset
import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from auditchain.services import link_entries, verify_log
from broker import audit
from broker.audit import Actor
from broker.models import (
    ArchivedEvent,
    AttributeHistory,
    AttributeValue,
    AuditEntry,
    Client,
    Delivery,
    Event,
    TrafficRecord,
)
from broker.reads.history import attributes_as_of, history_kept_from, lapsed_as_of
from broker.reads.progress import event_progress
from demo.scenario import load_scenario
from lifecycle.models import DroppedDay
from lifecycle.partitions import (
    AHEAD_DAYS,
    ATTRIBUTE_HISTORY,
    DELIVERIES,
    PARTITIONED,
    TRAFFIC,
    day_start,
    days_of,
    drop_day,
    ensure_partitions,
    today,
)
from lifecycle.reads import retention_state
from lifecycle.retention import (
    Waiting,
    apply_retention,
    carry_forward,
    horizon,
    past_retention,
)
from reports.export import export_changes
from reports.jobs import KINDS, job
from reports.results import Params
from reports.spark import Dataset
from tests.cast import log_in_proved

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

DAYS_AGO = 20


@pytest.fixture(autouse=True)
def no_day_partitions_left(settings, tmp_path):
    """Each test starts with only the default partitions, and its own dataset."""
    settings.REPORTS_DATASET = tmp_path / "dataset"
    settings.RETAIN_DAYS_BY_GROUP = {"deliveries": 10, "traffic": 10, "attributes": 10}
    drop_every_day()
    yield
    drop_every_day()


def drop_every_day() -> None:
    for table in PARTITIONED:
        for day in days_of(table):
            drop_day(table, day)


@pytest.fixture
def old_incident() -> dict:
    """An incident DAYS_AGO days ago, its events long expired."""
    load_scenario(servers=0)
    start = timezone.now() - timedelta(days=DAYS_AGO)
    call_command(
        "generate_traffic", "--servers", "30", "--deliveries", "300", "--controllers", "1",
        "--start", start.isoformat(), stdout=io.StringIO(),
    )  # fmt: skip
    events = list(Event.objects.filter(deliveries__isnull=False).distinct())
    return {event.pk: event_progress(event).total for event in events}


def rows_in(table) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT count(*) FROM "{table}"')
        return cursor.fetchone()[0]


def test_partitions_are_made_from_yesterday_to_the_days_ahead_once():
    made = ensure_partitions()

    for table in PARTITIONED:
        days = days_of(table)
        assert days[0] == today() - timedelta(days=1)
        assert days[-1] == today() + timedelta(days=AHEAD_DAYS)
        assert len(days) == AHEAD_DAYS + 2
    assert len(made) == len(PARTITIONED) * (AHEAD_DAYS + 2)
    assert ensure_partitions() == []


def test_rows_a_default_partition_took_move_into_the_day_made_for_them(old_incident):
    hops = TrafficRecord.objects.count()
    with connection.cursor() as cursor:  # as if written while the beat was stopped
        cursor.execute("CREATE TEMPORARY TABLE held AS SELECT * FROM broker_trafficrecord")
        for day in days_of(TRAFFIC):
            drop_day(TRAFFIC, day)
        cursor.execute("INSERT INTO broker_trafficrecord SELECT * FROM held")
    assert rows_in(TRAFFIC.default) == hops

    ensure_partitions()

    assert rows_in(TRAFFIC.default) == 0
    assert TrafficRecord.objects.count() == hops
    assert today() - timedelta(days=DAYS_AGO) in days_of(TRAFFIC)


def test_the_incident_writes_its_days_into_their_own_partitions(old_incident):
    assert rows_in(DELIVERIES.default) == 0
    assert rows_in(TRAFFIC.default) == 0
    first = today() - timedelta(days=DAYS_AGO)
    assert first in days_of(TRAFFIC)
    assert Delivery.objects.count() >= 300


def test_a_day_past_retention_waits_for_the_export_then_goes_and_its_events_keep_their_counts(
    old_incident,
):
    due = past_retention(DELIVERIES)
    assert due

    kept = apply_retention(export=False)

    assert {w.why for w in kept.waiting} == {"the reports have never exported it"}
    shown = {table.table: table for table in retention_state()}["broker_delivery"]
    assert shown.past == len(due) and not shown.ok
    assert shown.waiting[0] == Waiting("broker_delivery", due[0], kept.waiting[0].why)
    assert {d.table for d in kept.dropped} <= {"broker_clientchange"}  # no export to wait for
    dropped = apply_retention()
    assert not dropped.waiting
    assert not past_retention(DELIVERIES) and not past_retention(TRAFFIC)
    assert not Delivery.objects.exists() and not TrafficRecord.objects.exists()
    for event in Event.objects.filter(pk__in=old_incident):
        progress = event_progress(event)
        assert progress.archived and progress.total == old_incident[event.pk]
    assert ArchivedEvent.objects.count() == len(old_incident)
    assert DroppedDay.objects.filter(table="broker_delivery").count() == len(due)
    entries = AuditEntry.objects.filter(action="retention.drop", actor="system:retention")
    assert entries.count() == DroppedDay.objects.count()


def test_a_day_with_rows_written_since_the_export_waits(old_incident):
    export_changes()
    Delivery.objects.filter(pk=Delivery.objects.first().pk).update(state="failed")

    kept = apply_retention(export=False)

    assert "rows written since the reports' last export" in {w.why for w in kept.waiting}
    assert Delivery.objects.filter(state="failed").exists()


def test_a_day_holding_hops_of_a_live_event_waits(old_incident):
    live = Event.objects.first()
    Event.objects.filter(pk=live.pk).update(expires_at=timezone.now() + timedelta(hours=1))

    kept = apply_retention()

    reasons = {(w.table, w.why) for w in kept.waiting}
    assert ("broker_trafficrecord", "it holds rows of an event still live") in reasons
    assert TrafficRecord.objects.filter(event=live).exists()


def test_the_reports_answer_for_the_dropped_days_as_they_did_before(old_incident, spark, settings):
    export_changes()
    now = timezone.now()
    params = Params(window_start=now - timedelta(days=DAYS_AGO + 1), window_end=now)
    before = reports_of(spark, settings, params)

    dropped = apply_retention()

    assert dropped.dropped and not Delivery.objects.exists()
    assert reports_of(spark, settings, params) == before
    assert before["reach"].summary and before["timeline"].sections


def reports_of(spark, settings, params: Params) -> dict:
    data = Dataset(spark, settings.REPORTS_DATASET)
    return {kind: job(kind).run(data, params) for kind in KINDS}


def test_an_archived_events_pages_say_so_and_show_the_counts_kept(old_incident, client, operator):
    apply_retention()
    event = Event.objects.get(pk=next(iter(old_incident)))
    log_in_proved(client, operator)

    page = client.get(reverse("event", args=[event.pk])).content.decode()
    listed = client.get(reverse("events")).content.decode()
    health = client.get(reverse("health"), headers={"HX-Request": "true"}).content.decode()

    assert "data-archived" in page and "/reports/reach/?from=" in page
    assert f'data-targeted="{old_incident[event.pk].targeted}"' in page
    assert 'id="waiting"' not in page  # no receiver to list, nor to resend to
    assert "data-archived" in listed
    assert 'data-retention-table="broker_delivery" data-ok="yes"' in health


def a_month_of_audit_entries() -> None:
    """Thirty days of entries, a day's each, linked in the order they were written."""
    officer = Actor("user", "audrey")
    for days_ago in range(30, 0, -1):
        change = audit.Change(officer, "policy.set", f"client:web-{days_ago}", {})
        audit.record_changes([change], at=timezone.now() - timedelta(days=days_ago))
    link_entries()


def test_the_audit_log_keeps_its_own_days_once_exported_and_still_verifies(settings):
    a_month_of_audit_entries()
    settings.AUDIT_RETAIN_DAYS = 10
    assert apply_retention(export=False).audit_entries_removed == 0  # not exported yet

    kept = apply_retention()

    assert kept.audit_entries_removed == 21  # days 30 to 10: the tenth is older by now
    assert not AuditEntry.objects.filter(at__lt=timezone.now() - timedelta(days=10)).exists()
    assert AuditEntry.objects.filter(action="retention.audit").exists()
    link_entries()
    assert verify_log().found == 0


def test_the_audit_log_is_kept_whole_by_default():
    a_month_of_audit_entries()

    assert apply_retention().audit_entries_removed == 0
    assert AuditEntry.objects.count() >= 30


def a_receivers_changing_values(receiver: Client) -> dict:
    """Its region set 30, 15 and 5 days ago, a trust attested 25 days ago and revoked
    12 days ago (set as the services would, backdated): {name: when it changed}."""
    ago = {d: timezone.now() - timedelta(days=d) for d in (30, 25, 15, 12, 5)}
    values = AttributeValue.objects.filter(client=receiver)
    for days, region in ((30, "eu-west"), (15, "us-east"), (5, "ap-south")):
        values.filter(name="region").update(value=region, set_at=ago[days])
    AttributeValue.objects.update_or_create(
        client=receiver, name="clearance",
        defaults={"value": "high", "source": "client", "set_at": ago[25]},
    )  # fmt: skip
    values.filter(name="clearance").update(revoked_at=ago[12], revoked_by="user:audrey")
    return ago


def held_as_of(receiver: Client, moments) -> list:
    return [attributes_as_of(receiver, moment) for moment in moments]


def test_dropped_days_of_attribute_history_leave_every_value_standing_since_as_it_was(
    old_incident,
):
    receiver = Delivery.objects.first().receiver
    ago = a_receivers_changing_values(receiver)
    first_kept = day_start(horizon(ATTRIBUTE_HISTORY))
    moments = [first_kept, first_kept + timedelta(hours=1), ago[5], timezone.now()]
    before = held_as_of(receiver, moments)
    assert before[0]["region"].value == "us-east" and "clearance" not in before[0]

    dropped = apply_retention()

    assert {d.table for d in dropped.dropped} >= {ATTRIBUTE_HISTORY.table}
    assert not AttributeHistory.objects.filter(at__lt=first_kept).exists()
    assert held_as_of(receiver, moments) == before
    lapse = lapsed_as_of(receiver, timezone.now(), {"clearance"})["clearance"]
    assert lapse.how == "revoked" and lapse.at == ago[12]  # when it was, not when carried
    assert history_kept_from() == first_kept
    carried = AttributeHistory.objects.filter(carried_from__isnull=False)
    mine = dict(carried.filter(client=receiver).values_list("name", "carried_from"))
    assert mine["region"] == ago[15] and mine["clearance"] == ago[12]
    assert dropped.values_carried == carried.count()
    entry = AuditEntry.objects.get(action="retention.carry_forward")
    assert entry.details["values"] == carried.count()


def test_carrying_values_forward_a_second_time_adds_nothing_nor_for_removed_clients(
    old_incident,
):
    receiver = Delivery.objects.first().receiver
    a_receivers_changing_values(receiver)
    before_first_kept = AttributeHistory.objects.filter(
        at__lt=day_start(horizon(ATTRIBUTE_HISTORY))
    )
    standing = set(before_first_kept.filter(client=receiver).values_list("name", flat=True))
    removed = Client.objects.order_by("-pk").first().pk + 1_000
    before_first_kept.filter(client=receiver).update(client_id=removed)

    carried = carry_forward()
    assert not AttributeHistory.objects.filter(client_id__in=[removed, receiver.pk]).filter(
        carried_from__isnull=False
    )  # nothing of a client no longer registered
    before_first_kept.filter(client_id=removed).update(client_id=receiver.pk)
    assert carry_forward() == len(standing) and {"region", "clearance"} <= standing
    assert carry_forward() == 0
    assert AuditEntry.objects.filter(action="retention.carry_forward").count() == 2 - (not carried)


def test_the_dataset_keeps_the_original_attribute_history_not_retentions_copies(
    old_incident, settings
):
    a_receivers_changing_values(Delivery.objects.first().receiver)
    originals = AttributeHistory.objects.count()

    apply_retention()
    export_changes()

    exported = pyarrow.dataset.dataset(settings.REPORTS_DATASET / "attribute_history")
    assert exported.count_rows() == originals
    assert AttributeHistory.objects.filter(carried_from__isnull=False).exists()


def test_why_an_event_sent_before_the_history_kept_says_its_checks_cannot_read_then(
    old_incident, client, operator
):
    delivery = Delivery.objects.select_related("event", "receiver").first()
    a_receivers_changing_values(delivery.receiver)
    apply_retention()
    log_in_proved(client, operator)

    url = reverse("event-why", args=[delivery.event.pk, delivery.receiver.name])
    page = client.get(url).content.decode()

    assert "data-history-dropped" in page and "/reports/timeline/" in page
