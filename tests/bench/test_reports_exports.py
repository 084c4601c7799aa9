"""The reports benchmark's runs after an export: the answers it writes beside the
dataset, as an export writes them, and the copy of the dataset they go into."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from bench import reports as bench
from reports.dataset import TABLES

MOMENT = datetime(2026, 11, 29, 2, 0, tzinfo=UTC)


def write(dataset, table: str, batch: int, rows: list[dict]) -> None:
    folder = dataset / table / f"batch={batch}"
    folder.mkdir(parents=True)
    schema = pa.schema([(c.name, c.type) for c in TABLES[table].columns])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "part-0.parquet")


def delivery(number: int, state: str) -> dict:
    return {
        "id": number, "event_id": "e1", "published_at": MOMENT, "receiver_id": 7,
        "sender_id": 8, "state": state, "delivered_at": MOMENT, "txid": 40,
        "received_at": MOMENT if state != "pending" else None,
    }  # fmt: skip


def a_dataset(tmp_path):
    dataset = tmp_path / "dataset-5"
    states = ["acked", "delivered", "pending", "acked", "delivered"]
    write(dataset, "deliveries", 41, [delivery(n, s) for n, s in enumerate(states, 1)])
    write(dataset, "audit", 41, [{"id": 90, "at": MOMENT, "actor": "user:olivia"}])
    clients = dataset / "clients"
    clients.mkdir()
    table = pa.table({"id": [7], "name": ["web-00007"]})
    pq.write_table(table, clients / "part-0.parquet")
    return dataset


def test_each_export_answers_the_newest_deliveries_not_answered_yet(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "ANSWERS_PER_EXPORT", 2)
    answers = bench.written_answers(a_dataset(tmp_path))

    first = pq.read_table(answers / "deliveries" / "batch=42").to_pylist()
    second = pq.read_table(answers / "deliveries" / "batch=43").to_pylist()
    assert [row["id"] for row in first] == [5, 3] and [row["id"] for row in second] == [2, 4]
    assert {row["state"] for row in first + second} == {"acked"}
    assert first[1]["received_at"] == MOMENT  # a pending delivery: received as it answers
    assert first[1]["acked_at"] == MOMENT + timedelta(seconds=1)
    entries = pq.read_table(answers / "audit" / "batch=43").to_pylist()
    assert [(e["id"], e["actor"], e["target"], e["txid"]) for e in entries] == [
        (93, "client:web-00007", "delivery:2", 43),
        (94, "client:web-00007", "delivery:4", 43),
    ]


def test_an_export_s_audit_batch_goes_in_before_its_deliveries(tmp_path):
    answers = tmp_path / "answers"
    for table in ("deliveries", "audit"):
        for batch in (10, 9):
            (answers / table / f"batch={batch}").mkdir(parents=True)

    found = [(b.parent.name, b.name) for b in bench._in_export_order(answers)]

    assert found == [
        ("audit", "batch=9"), ("deliveries", "batch=9"),
        ("audit", "batch=10"), ("deliveries", "batch=10"),
    ]  # fmt: skip


def test_the_session_s_copy_links_the_dataset_and_is_removed_after(tmp_path):
    dataset = a_dataset(tmp_path)
    original = next((dataset / "audit").rglob("*.parquet"))
    with bench.linked_copy(dataset) as copy:
        linked = next((copy / "audit").rglob("*.parquet"))
        assert linked.stat().st_ino == original.stat().st_ino
        bench.link_batch(dataset / "deliveries" / "batch=41", copy / "audit2")
        assert (copy / "audit2" / "batch=41" / "part-0.parquet").exists()
    assert not copy.exists() and original.exists()
    assert not (dataset / "audit2").exists()
