"""Refusals are audited whatever the refused party sent, and a failing audit write
never turns a refusal into a crash."""

from __future__ import annotations

import logging

import pytest

from broker.audit import Actor, Change, record_changes, record_refusal, refusals_recorded
from broker.errors import InvalidInput
from broker.models import AuditEntry
from tests.broker.failing_database import inserts_refused

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

INTRUDER = Actor("agent", "203.0.113.9:4242")


def test_a_refusal_of_unstorable_input_is_recorded_with_its_text_spelled_out():
    entry = record_refusal(
        actor=Actor("client", "web\x00" + "x" * 300),
        action="attributes.state",
        target="client:web\ud800",
        reason="hostname may not hold \x00",
        details={"attempted": {"host\x00name": "a\udc00b", "load": float("nan"), "n": 2**80}},
    )
    stored = AuditEntry.objects.get(pk=entry.pk)
    assert stored.actor.startswith(r"client:web\u0000xxx") and len(stored.actor) == 200
    assert stored.target == r"client:web\ud800"
    assert stored.reason == r"hostname may not hold \u0000"
    assert stored.details == {"attempted": {r"host\u0000name": r"a\udc00b", "load": "nan",
                                            "n": 2**80},
                              "category": "attribute_not_authorised"}  # fmt: skip


def test_when_the_audit_write_fails_the_refusal_still_stands_and_is_logged(caplog):
    with (
        inserts_refused("broker_auditentry"),
        caplog.at_level(logging.ERROR, logger="broker.audit"),
        pytest.raises(InvalidInput) as refused,
        refusals_recorded(actor=INTRUDER, action="agent.login", target="agent-socket"),
    ):
        raise InvalidInput("token must be text", field="token")
    assert refused.value.field == "token"
    assert "AUDIT ENTRY LOST" in caplog.text and "agent.login" in caplog.text
    assert not AuditEntry.objects.exists()


def test_changes_recorded_together_keep_their_order_and_every_character():
    odd = 'quote " backslash \\ braces {a,b} comma, NULL "NULL" é 漢 🛡'
    changes = [
        Change(Actor("client", f"web-{n} {odd}"), "attributes.state", f"client:{odd}",
               {"values": {"note": odd, odd: [n, 2**70, 0.1, None, True]}})
        for n in range(3)
    ]  # fmt: skip
    record_changes(changes)
    stored = list(AuditEntry.objects.order_by("pk"))
    assert [(e.actor, e.target, e.details, e.outcome) for e in stored] == [
        (str(c.actor), c.target, c.details, AuditEntry.Outcome.DONE) for c in changes
    ]
    assert len({e.at for e in stored}) == 1 and all(e.reason == "" for e in stored)
