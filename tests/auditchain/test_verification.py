"""The audit log's evidence: an entry edited or written without the console's key (as
psql would) is found and named; the console's own entries, of every writer, verify."""

from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from auditchain.verification import CHANGED, UNAUTHENTICATED, findings
from broker import audit
from broker.audit import Actor, authentication_code, canonical
from broker.errors import InvalidInput
from broker.models import AuditEntry

# Committed: refusals are written on a connection of their own (broker.audit).
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])
OFFICER = Actor("user", "audrey")
ODD = 'a "quoted" \\ tab\t é 漢 🛡 NUL-free'


@pytest.fixture
def entries():
    """One entry of each writer: a change, changes in one statement, a refusal."""
    details = {"text": ODD, "n": 1e16, "small": 1.5e-7, "zero": -0.0}
    audit.record_change(actor=OFFICER, action="policy.set", target="client:web-1", details=details)
    audit.record_changes([
        audit.Change(OFFICER, "attributes.state", f"client:web-{n}", {"values": {"load": n / 3}})
        for n in range(3)
    ])  # fmt: skip
    with (
        pytest.raises(InvalidInput),
        audit.refusals_recorded(actor=OFFICER, action="event.publish", target=ODD),
    ):
        raise InvalidInput("selector is not valid", field="selector")
    return list(AuditEntry.objects.order_by("id"))


def test_the_consoles_own_entries_of_every_writer_verify(entries):
    assert len(entries) == 5 and all(entry.mac for entry in entries)
    assert list(findings()) == []
    call_command("verify_audit")


def test_an_entry_edited_in_sql_is_found_and_named(entries):
    edited = entries[0]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE broker_auditentry SET actor = 'user:mallory' WHERE id = %s",
                       [edited.id])  # fmt: skip
    assert [(f.entry_id, f.problem) for f in findings()] == [(edited.id, CHANGED)]


def test_an_entrys_details_edited_in_sql_are_found(entries):
    edited = entries[1]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_auditentry SET details = jsonb_set(details, '{values,load}', '0.99')"
            " WHERE id = %s", [edited.id],
        )  # fmt: skip
    assert [(f.entry_id, f.problem) for f in findings()] == [(edited.id, CHANGED)]


def test_an_entry_inserted_in_sql_is_found_with_or_without_a_made_up_code(entries):
    with connection.cursor() as cursor:
        for mac in ("", "0" * 64):
            cursor.execute(
                "INSERT INTO broker_auditentry (at, actor, action, target, outcome, reason,"
                " details, mac) VALUES (now(), 'user:audrey', 'policy.set', 'client:web-1',"
                " 'done', '', '{}', %s)", [mac],
            )  # fmt: skip
    inserted = list(AuditEntry.objects.filter(id__gt=entries[-1].id).order_by("id"))
    assert [(f.entry_id, f.problem) for f in findings()] == [
        (inserted[0].id, UNAUTHENTICATED), (inserted[1].id, CHANGED)
    ]  # fmt: skip
    with pytest.raises(CommandError, match="does not verify: 2 findings over 7 entries"):
        call_command("verify_audit")


def test_entries_authenticated_under_an_earlier_secret_key_still_verify(entries, settings):
    earlier = settings.SECRET_KEY
    with override_settings(SECRET_KEY="a new key", SECRET_KEY_FALLBACKS=[earlier]):
        assert list(findings()) == []
    with override_settings(SECRET_KEY="a new key", SECRET_KEY_FALLBACKS=[]):
        assert {f.problem for f in findings()} == {CHANGED}


def test_a_code_is_the_same_before_and_after_the_database_spells_the_details_again():
    stored = {"b": [1e16, 1.5e-7, -0.0, 10, True, None], "a": {"é": ODD}}
    respelled = {"a": {"é": ODD}, "b": [10000000000000000, 1.5e-07, 0.0, 10.0, True, None]}
    assert canonical(stored) == canonical(respelled)
    assert canonical({"n": 1}) != canonical({"n": "1"}) != canonical({"n": True})
    at = datetime(2026, 12, 7, 17, 0, 0, 123456, tzinfo=UTC)
    code = lambda details: authentication_code(  # noqa: E731
        at=at, actor="user:a", action="x", target="", outcome="done", reason="", details=details
    )
    assert code(stored) == code(respelled) != code({**stored, "c": 1})
