"""The incremental export to Parquet: every committed change exactly once, by
watermark, whatever else is writing; odd text intact; another database's files gone."""

from __future__ import annotations

import shutil

import psycopg
import pyarrow.parquet as pq
import pytest
from django.db import connection

from broker.audit import Actor
from broker.models import AuditEntry, Client, Delivery, Event
from broker.services.deliveries import acknowledge_delivery, confirm_receipt
from broker.services.events import publish_event
from demo.scenario import WORM_ALERT, load_scenario
from reports.dataset import LAYOUT, LAYOUT_FILE
from reports.export import export_changes, freshness
from reports.models import ExportWatermark
from tests.broker.tree_helpers import wait_until_idle
from tests.reports.audit_entries import audit_entry

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

ODD = 'semi;colon, "quoted"\nnew line, tab\t, ünïcödé ✓ and a backslash \\'


@pytest.fixture
def dataset(settings, tmp_path):
    settings.REPORTS_DATASET = tmp_path / "dataset"
    return settings.REPORTS_DATASET


@pytest.fixture
def alert(celery_worker):
    scenario = load_scenario(servers=8)
    wait_until_idle()
    event = publish_event(
        sender=scenario.controllers["northwest-controller"],
        content={**WORM_ALERT, "note": ODD},
        selector='region == "Northwest"',
        lifetime_s=600,
    )
    wait_until_idle()
    return event


def rows(dataset, table: str) -> list[dict]:
    folder = dataset / table
    if not folder.exists():
        return []
    return pq.read_table(folder).to_pylist()


def latest(dataset, table: str) -> dict:
    """Per id, the row version of the latest transaction (as the jobs read it)."""
    newest = {}
    for row in rows(dataset, table):
        if row["id"] not in newest or row["txid"] > newest[row["id"]]["txid"]:
            newest[row["id"]] = row
    return newest


def test_the_first_export_holds_every_event_and_delivery_as_the_database_has_them(dataset, alert):
    export_changes()
    [event] = [row for row in rows(dataset, "events") if row["id"] == str(alert.id)]
    assert event["kind"] == WORM_ALERT["kind"]
    assert event["published_at"] == alert.published_at
    assert event["sender"] == "northwest-controller"
    deliveries = latest(dataset, "deliveries")
    expected = Delivery.objects.filter(event=alert)
    assert {d.pk for d in expected} <= set(deliveries)
    for delivery in expected:
        assert deliveries[delivery.pk]["state"] == delivery.state
        assert deliveries[delivery.pk]["delivered_at"] == delivery.delivered_at
        assert deliveries[delivery.pk]["published_at"] == alert.published_at
    assert len(rows(dataset, "deliveries")) == Delivery.objects.count()


def test_odd_characters_in_text_survive_the_export(dataset, alert):
    alert.selector = ODD
    alert.save(update_fields=["selector"])
    export_changes()
    [event] = [row for row in rows(dataset, "events") if row["id"] == str(alert.id)]
    assert event["selector"] == ODD


def test_a_second_export_takes_only_what_changed_and_the_latest_version_wins(dataset, alert):
    export_changes()
    first_rows = len(rows(dataset, "deliveries"))
    delivery = Delivery.objects.filter(event=alert).order_by("position").first()
    receiver = delivery.receiver
    confirm_receipt(client=receiver, position=delivery.position, actor=Actor("client", "x"))
    acknowledge_delivery(
        client=receiver, delivery_id=delivery.pk, status="failed",
        result={"error": ODD}, actor=Actor("client", receiver.name),
    )  # fmt: skip
    second = export_changes()
    assert second.rows["deliveries"] == 1
    assert len(rows(dataset, "deliveries")) == first_rows + 1
    newest = latest(dataset, "deliveries")[delivery.pk]
    assert newest["state"] == "failed"
    assert '"error"' in newest["failure"]
    assert export_changes().rows["deliveries"] == 0


def test_a_transaction_open_during_an_export_is_taken_by_the_next_one(dataset, alert):
    export_changes()
    settings_dict = connection.settings_dict
    with psycopg.connect(
        host=settings_dict["HOST"], port=settings_dict["PORT"],
        dbname=settings_dict["NAME"], user=settings_dict["USER"],
        password=settings_dict["PASSWORD"] or None,
    ) as other:  # fmt: skip
        other.execute(
            "INSERT INTO broker_auditentry (at, actor, action, target, outcome, reason, details)"
            " VALUES (now(), 'user:slow', 'test.slow', '', 'done', '', '{}')"
        )
        during = export_changes()  # the insert is not committed yet
        other.commit()
    assert during.rows["audit"] == 0 or "test.slow" not in _actions(dataset)
    export_changes()
    assert _actions(dataset).count("test.slow") == 1


def _actions(dataset) -> list[str]:
    return [row["action"] for row in rows(dataset, "audit")]


def test_watermarks_say_how_fresh_each_table_is(dataset, alert):
    assert all(at is None for at in freshness().values())
    result = export_changes()
    assert set(freshness().values()) == {result.at}
    assert ExportWatermark.objects.get(table="events").txid == result.watermark


def test_an_emptied_database_starts_a_new_dataset(dataset, alert):
    export_changes()
    ExportWatermark.objects.all().delete()
    Event.objects.filter(pk=alert.pk).delete()
    export_changes()
    assert str(alert.id) not in {row["id"] for row in rows(dataset, "events")}
    assert AuditEntry.objects.count() == len(rows(dataset, "audit"))


def test_a_dataset_of_another_layout_is_exported_again_from_the_start(dataset, alert):
    export_changes()
    (dataset / LAYOUT_FILE).write_text(f"{LAYOUT - 1}\n")  # as an older release wrote it
    stale = dataset / "deliveries" / "batch=1" / "part-0.parquet"
    stale.parent.mkdir()
    stale.write_bytes(b"a batch of the old layout")
    export_changes()
    assert (dataset / LAYOUT_FILE).read_text().strip() == str(LAYOUT)
    assert not stale.parent.exists()
    assert len(list((dataset / "deliveries").iterdir())) == 1  # one batch: everything
    assert len(rows(dataset, "deliveries")) == Delivery.objects.count()
    assert ExportWatermark.objects.get(table="deliveries").batches == 1


def test_a_snapshot_table_exported_again_unchanged_is_left_as_it_was(dataset, alert):
    export_changes()
    written = dataset / "clients" / "part-0.parquet"
    before = written.stat()
    export_changes()
    assert (written.stat().st_ino, written.stat().st_mtime_ns) == (
        before.st_ino,
        before.st_mtime_ns,
    )
    Client.objects.filter(name="web-00001").update(is_active=False)
    export_changes()
    assert written.stat().st_ino != before.st_ino
    assert [row["is_active"] for row in rows(dataset, "clients") if row["name"] == "web-00001"] == [
        False
    ]


def test_a_removed_dataset_folder_is_exported_again_from_the_start(dataset):
    first = audit_entry("test.before")
    export_changes()
    shutil.rmtree(dataset)  # an operator's clean-up, or REPORTS_DATASET moved elsewhere
    audit_entry("test.after")
    export_changes()
    assert first.pk in latest(dataset, "audit")
    assert len(latest(dataset, "audit")) == AuditEntry.objects.count()


def test_a_table_whose_folder_was_emptied_is_exported_again_from_the_start(dataset):
    first = audit_entry("test.before")
    export_changes()
    for batch in (dataset / "audit").iterdir():
        shutil.rmtree(batch)
    audit_entry("test.after")
    export_changes()
    assert first.pk in latest(dataset, "audit")
    assert len(latest(dataset, "audit")) == AuditEntry.objects.count()
    assert ExportWatermark.objects.get(table="audit").batches == 1
