"""The console knows a database restored from a logical dump whose transaction counter
was not moved: its rows carry `txid`s the counter has not reached (lifecycle.reads)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from auditchain.models import ChainHead
from broker.models import AuditEntry
from console.health import probe_database
from lifecycle.reads import transaction_counter

pytestmark = pytest.mark.django_db

FAR_AHEAD = (7 << 32) + 12345  # epoch 7: what a restored row of an older server carries


def an_audit_entry() -> AuditEntry:
    return AuditEntry.objects.create(
        at="2026-01-01T00:00:00Z", actor="user:olivia", action="x", outcome="done"
    )


def restored_row_from_far_ahead(table: str = "broker_auditentry") -> None:
    an_audit_entry()
    with connection.cursor() as cursor:
        # As pg_restore writes it: the trigger that stamps each write is not run.
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(f"UPDATE {table} SET txid = %s", [FAR_AHEAD])
        cursor.execute("SET LOCAL session_replication_role = origin")


def test_a_database_whose_rows_the_counter_has_passed_is_not_behind():
    an_audit_entry()

    counter = transaction_counter()

    assert not counter.behind
    assert counter.needed <= counter.next_value
    probe_database()  # passes


def test_a_row_written_past_the_counter_makes_it_behind_and_names_the_column():
    restored_row_from_far_ahead()

    counter = transaction_counter()

    assert counter.behind
    assert counter.needed == FAR_AHEAD + 1
    assert counter.needed_by == "broker_auditentry.txid"
    assert counter.epoch_needed == 8


def test_a_watermark_the_counter_has_not_reached_makes_it_behind_and_reaching_it_is_enough():
    ChainHead.objects.create(horizon=FAR_AHEAD)

    counter = transaction_counter()

    assert counter.behind
    assert (counter.needed, counter.needed_by) == (FAR_AHEAD, "auditchain_chainhead.horizon")


def test_the_health_check_of_the_database_fails_and_says_what_to_run():
    restored_row_from_far_ahead()

    with pytest.raises(RuntimeError, match=r"restored from a logical dump.*after_restore"):
        probe_database()


def test_after_restore_prints_the_epoch_to_set_and_fails_until_it_is():
    restored_row_from_far_ahead()
    output = io.StringIO()

    with pytest.raises(CommandError, match="behind the restored rows"):
        call_command("after_restore", "--pgdata", "/srv/pg", stdout=output)

    assert "pg_resetwal -e 8 -D /srv/pg" in output.getvalue()
    assert "broker_auditentry.txid" in output.getvalue()


def test_after_restore_lets_a_database_whose_counter_is_past_its_rows_run():
    output = io.StringIO()
    call_command("after_restore", stdout=output)
    assert "the console may run on this database" in output.getvalue()
