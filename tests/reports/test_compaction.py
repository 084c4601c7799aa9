"""Compaction: many export batches become one, and the dataset reads the same."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from broker.models import AuditEntry
from reports.compaction import compact_dataset, finish_interrupted
from reports.dataset import batches
from reports.export import export_changes
from reports.spark import Dataset
from tests.reports.audit_entries import audit_entry

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])


def audit_rows(spark, root) -> list[tuple]:
    frame = Dataset(spark, root).table("audit")
    return sorted((row.id, row.reason, row.txid) for row in frame.collect())


def test_many_batches_become_one_that_reads_the_same_latest_versions(spark, settings, tmp_path):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    first, second = audit_entry("test.first"), audit_entry("test.second")
    export_changes()
    for reason in ("once", "twice", "thrice"):
        AuditEntry.objects.filter(pk=first.pk).update(reason=reason)
        export_changes()
    audit_entry("test.third")
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
    audit_entry("test.only")
    export_changes()
    assert compact_dataset(spark, root) == {}


class Stopped(Exception):
    """The process stopping at that point (nothing after it runs)."""


def stop_after(monkeypatch, module_function: str, calls: int) -> None:
    """Let `calls` calls of `module_function` (Path.rename, shutil.rmtree) run, then stop."""
    owner, name = module_function.rsplit(".", 1)
    target = {"Path": Path, "shutil": shutil}[owner]
    real = getattr(target, name)
    made = []

    def counted(*args, **kwargs):
        if len(made) == calls:
            raise Stopped(module_function)
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, counted)


def hidden_leftovers(folder: Path) -> list[str]:
    return sorted(child.name for child in folder.iterdir() if child.name.startswith("."))


@pytest.mark.parametrize(
    ("step", "calls"),
    [("Path.rename", n) for n in range(4)] + [("shutil.rmtree", 0)],
)
def test_a_compaction_stopped_part_way_loses_no_row(
    spark, settings, tmp_path, monkeypatch, step, calls
):
    settings.REPORTS_DATASET = root = tmp_path / "dataset"
    first = audit_entry("test.first")
    for reason in ("once", "twice"):
        AuditEntry.objects.filter(pk=first.pk).update(reason=reason)
        export_changes()
    audit_entry("test.last")
    export_changes()
    before = audit_rows(spark, root)
    with monkeypatch.context() as patched:
        stop_after(patched, step, calls)  # 3 batches: moved aside, then the new one in
        with pytest.raises(Stopped):
            compact_dataset(spark, root, at_least=2)

    finish_interrupted(root)  # as the next worker starts

    assert hidden_leftovers(root / "audit") == []
    assert audit_rows(spark, root) == before
    done_before = step == "shutil.rmtree"  # stopped after the new batch took its place
    assert compact_dataset(spark, root, at_least=2) == ({} if done_before else {"audit": 3})
    assert len(batches(root / "audit")) == 1
    assert audit_rows(spark, root) == before
