"""Compaction: many export batches become one, and the dataset reads the same."""

from __future__ import annotations

import pytest
from django.utils import timezone

from broker.models import AuditEntry
from reports.compaction import compact_dataset
from reports.dataset import batches
from reports.export import export_changes
from reports.spark import Dataset

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])


def entry(action: str) -> AuditEntry:
    return AuditEntry.objects.create(
        at=timezone.now(), actor="user:olivia", action=action, target="t", outcome="done"
    )


def audit_rows(spark, root) -> list[tuple]:
    frame = Dataset(spark, root).table("audit")
    return sorted((row.id, row.reason, row.txid) for row in frame.collect())


def test_many_batches_become_one_that_reads_the_same_latest_versions(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    first, second = entry("test.first"), entry("test.second")
    export_changes()
    for reason in ("once", "twice", "thrice"):
        AuditEntry.objects.filter(pk=first.pk).update(reason=reason)
        export_changes()
    entry("test.third")
    export_changes()
    before = audit_rows(spark, root)
    assert len(batches(root / "audit")) == 5

    assert compact_dataset(spark, root, at_least=2) == {"audit": 5}

    assert len(batches(root / "audit")) == 1
    assert audit_rows(spark, root) == before
    assert next(r for r in before if r[0] == first.pk)[1] == "thrice"
    AuditEntry.objects.filter(pk=second.pk).update(reason="after compaction")
    export_changes()
    assert {r[0]: r[1] for r in audit_rows(spark, root)}[second.pk] == "after compaction"
    assert len(audit_rows(spark, root)) == len(before)


def test_a_table_with_few_batches_is_left_alone(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    entry("test.only")
    export_changes()
    assert compact_dataset(spark, root) == {}
