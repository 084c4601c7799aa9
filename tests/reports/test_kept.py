"""Tables kept in the warm session's memory read what the dataset's files say, after
exports that add batches, a compaction, and a batch written again."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from broker.models import AuditEntry, Client, ClientModel
from reports import kept
from reports.compaction import compact_dataset
from reports.dataset import TABLES
from reports.export import export_changes
from reports.jobs.frames import deliveries_to_receivers
from reports.runner import keep_dataset
from reports.spark import Dataset
from tests.reports.audit_entries import audit_entry

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])


@pytest.fixture(autouse=True)
def nothing_kept():
    kept.forget()
    yield
    kept.forget()


# An export's changes to a kept frame are merged into it at once (these tests' frames
# are of a few rows), or kept apart from it however many they are.
MERGED, KEPT_APART = kept.MERGE_SHARE, 1e9
CHANGES = pytest.mark.parametrize(
    "merge_share", [MERGED, KEPT_APART], ids=["merged", "apart"], indirect=True
)


@pytest.fixture
def merge_share(request, monkeypatch):
    monkeypatch.setattr(kept, "MERGE_SHARE", request.param)
    return request.param


def a_client() -> Client:
    model = ClientModel.objects.create(name="web-server")
    return Client.objects.create(name="web-00001", model=model, secret_hash="x")


def rows(frame) -> list[tuple]:
    return sorted((row.id, row.reason, row.txid) for row in frame.collect())


def kept_and_read(spark, root) -> tuple[list, list]:
    """The audit table as kept, and as read from its files now."""
    return (
        rows(Dataset(spark, root, keep=True).table("audit")),
        rows(Dataset(spark, root).table("audit")),
    )


def test_an_unchanged_table_is_the_same_kept_frame(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    audit_entry("test.first")
    export_changes()
    first = Dataset(spark, root, keep=True).table("audit")
    assert Dataset(spark, root, keep=True).table("audit") is first
    assert first.is_cached


@CHANGES
def test_new_batches_replace_the_rows_they_hold_newer_versions_of(
    spark, settings, tmp_path, merge_share
):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    first, _ = audit_entry("test.first"), audit_entry("test.second")
    export_changes()
    kept_and_read(spark, root)
    for reason in ("once", "twice"):
        AuditEntry.objects.filter(pk=first.pk).update(reason=reason)
        audit_entry(f"test.{reason}")
        export_changes()
        found, expected = kept_and_read(spark, root)
        assert found == expected
    assert len(found) == 4
    assert next(r for r in found if r[0] == first.pk)[1] == "twice"


@CHANGES
def test_after_a_compaction_the_table_is_read_again_the_same(
    spark, settings, tmp_path, merge_share
):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    first = audit_entry("test.first")
    export_changes()
    for reason in ("once", "twice", "thrice"):
        kept_and_read(spark, root)  # kept, then changed by the next export
        AuditEntry.objects.filter(pk=first.pk).update(reason=reason)
        export_changes()
    before, _ = kept_and_read(spark, root)
    assert (kept._kept["audit"].changes is None) == (merge_share == MERGED)

    compact_dataset(spark, root, at_least=2)

    assert kept_and_read(spark, root) == (before, before)


def test_a_batch_written_again_under_its_name_is_read_again(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    audit_entry("test.first")
    export_changes()
    kept_and_read(spark, root)
    written = next((root / "audit").rglob("*.parquet"))
    table = pq.read_table(written)
    reasons = pa.array(["written again"] * len(table), pa.string())
    column = table.schema.get_field_index("reason")
    pq.write_table(table.set_column(column, "reason", reasons), written)

    found, expected = kept_and_read(spark, root)

    assert found == expected
    assert {reason for _, reason, _ in found} == {"written again"}


def test_another_dataset_folder_lets_the_first_go(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "one"
    audit_entry("test.first")
    export_changes()
    first = Dataset(spark, root, keep=True).table("audit")
    other = tmp_path / "other"
    shutil.copytree(root, other)

    assert rows(Dataset(spark, other, keep=True).table("audit")) == rows(first)
    assert not first.is_cached


def test_a_snapshot_table_exported_again_is_read_again(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    client = a_client()
    export_changes()
    first = Dataset(spark, root, keep=True).table("clients")
    assert [row.is_active for row in first.collect()] == [True]
    Client.objects.filter(pk=client.pk).update(is_active=False)

    export_changes()

    again = Dataset(spark, root, keep=True).table("clients")
    assert [row.is_active for row in again.collect()] == [False]


@CHANGES
def test_a_frame_derived_row_by_row_reads_only_an_export_s_new_rows(
    spark, settings, tmp_path, merge_share
):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    client = a_client()
    audit_entry("test.first")
    export_changes()
    built_from = []

    def actions(audit):
        built_from.append(audit)
        return audit.select("id", F.upper("action").alias("action"))

    def derived():
        data = Dataset(spark, root, keep=True)
        return data.derived_rows("actions", "audit", ("clients",), actions)

    first = derived()
    assert derived() is first and len(built_from) == 1
    audit_entry("test.second")
    export_changes()

    assert sorted(row.action for row in derived().collect()) == ["TEST.FIRST", "TEST.SECOND"]
    assert len(built_from) == 2 and built_from[-1].count() == 1  # the new batch alone
    assert (kept._kept["actions"].changes is None) == (merge_share == MERGED)
    Client.objects.filter(pk=client.pk).update(is_active=False)  # a looked-up table
    export_changes()
    assert sorted(row.action for row in derived().collect()) == ["TEST.FIRST", "TEST.SECOND"]
    assert len(built_from) == 3 and built_from[-1].count() == 2  # the whole table again
    assert "audit" in kept._kept  # two batches: their rows' versions sorted out once


def test_a_frame_derived_row_by_row_from_one_batch_reads_its_files_and_keeps_it_not(
    spark, settings, tmp_path
):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    audit_entry("test.first")
    audit_entry("test.second")
    export_changes()

    data = Dataset(spark, root, keep=True)
    frame = data.derived_rows("actions", "audit", (), lambda audit: audit.select("id", "action"))

    assert sorted(row.action for row in frame.collect()) == ["test.first", "test.second"]
    assert frame.is_cached and "audit" not in kept._kept


@CHANGES
def test_a_frame_derived_per_key_is_built_again_only_for_an_export_s_keys(
    spark, settings, tmp_path, merge_share
):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    client = a_client()
    audit_entry("test.first", actor="user:olivia")
    audit_entry("test.second", actor="user:olivia")
    export_changes()
    built_for = []

    def entries_per_actor(actors):
        built_for.append(None if actors is None else sorted(r.actor for r in actors.collect()))
        audit = Dataset(spark, root, keep=True).table("audit")
        if actors is not None:
            audit = audit.join(actors, "actor", "left_semi")
        return audit.groupBy("actor").agg(F.count(F.lit(1)).alias("entries"))

    def derived():
        data = Dataset(spark, root, keep=True)
        return data.derived_by_key("per actor", "audit", "actor", ("clients",), entries_per_actor)

    def counted():
        return sorted((row.actor, row.entries) for row in derived().collect())

    assert counted() == [("user:olivia", 2)] and built_for == [None]
    audit_entry("test.third", actor="user:sam")
    export_changes()
    assert counted() == [("user:olivia", 2), ("user:sam", 1)]
    assert built_for[-1] == ["user:sam"]  # the new batch's key alone
    audit_entry("test.fourth", actor="user:olivia")
    export_changes()
    assert counted() == [("user:olivia", 3), ("user:sam", 1)]  # all of its rows again
    assert built_for[-1] == ["user:olivia"]
    assert (kept._kept["per actor"].changes is None) == (merge_share == MERGED)
    Client.objects.filter(pk=client.pk).update(is_active=False)  # a looked-up table
    export_changes()
    assert counted() == [("user:olivia", 3), ("user:sam", 1)]
    assert built_for[-1] is None  # every key again


def test_a_small_table_s_rows_are_collected_again_only_when_it_changes(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    client = a_client()
    export_changes()
    first = Dataset(spark, root, keep=True).rows("clients")
    assert Dataset(spark, root, keep=True).rows("clients") is first
    Client.objects.filter(pk=client.pk).update(is_active=False)

    export_changes()

    assert [row.is_active for row in Dataset(spark, root, keep=True).rows("clients")] == [False]
    assert [row.is_active for row in Dataset(spark, root).rows("clients")] == [False]


def test_a_derived_frame_is_kept_until_one_of_its_tables_changes(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    client = a_client()
    audit_entry("test.first")
    export_changes()
    builds = []

    def active_clients(data):
        builds.append(data)
        return data.table("clients").select("name", "is_active")

    def derived():
        data = Dataset(spark, root, keep=True)
        return data.derived("active clients", ("clients",), lambda: active_clients(data))

    first = derived()
    assert derived() is first and len(builds) == 1
    audit_entry("test.second")  # another table's change leaves it be
    export_changes()
    assert derived() is first
    Client.objects.filter(pk=client.pk).update(is_active=False)
    export_changes()

    again = derived()
    assert [tuple(row) for row in again.collect()] == [("web-00001", False)]
    assert len(builds) == 2 and not first.is_cached


def test_the_worker_keeps_every_derived_frame_as_it_starts(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    audit_entry("test.first")
    keep_dataset()  # nothing exported yet: nothing to keep, no error
    export_changes()
    keep_dataset()
    data = Dataset(spark, root, keep=True)
    assert deliveries_to_receivers(data).is_cached
    # Read through derived frames only, and of one batch each: read, not kept.
    assert "deliveries" not in kept._kept and "audit" not in kept._kept
    derived = [name for name in kept._kept if name not in TABLES]
    # Every frame a job derives: the receivers' deliveries, the timeline's four, the
    # tree's hops with the hop before, the audit's entries read, policy versions dated
    # and policy texts, the latency's deliveries with their hops, the reach's tallies and
    # its deliveries never answered.
    assert len(derived) == 12 and all(kept._kept[name].frame.is_cached for name in derived)


def test_an_export_s_changes_are_kept_apart_until_they_reach_their_share(
    spark, settings, tmp_path, monkeypatch
):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    first = audit_entry("test.first")
    for n in range(9):
        audit_entry(f"test.more{n}")
    export_changes()
    base = Dataset(spark, root, keep=True).table("audit")
    monkeypatch.setattr(kept, "MERGE_SHARE", 0.35)  # 3.5 of its 10 rows

    AuditEntry.objects.filter(pk=first.pk).update(reason="once")
    export_changes()  # a key and a row: kept apart
    found, expected = kept_and_read(spark, root)
    assert found == expected and kept._kept["audit"].base is base and base.is_cached
    audit_entry("test.eleventh")
    export_changes()  # two keys and two rows: merged

    found, expected = kept_and_read(spark, root)
    assert found == expected and len(found) == 11
    assert kept._kept["audit"].changes is None and not base.is_cached
