"""The audit chain: entries linked in the order they were written; an entry removed, a
link changed or removed, and an entry slipped in behind the chain are each found."""

import pytest
from django.db import connection

from auditchain import verification
from auditchain.models import AuditLink, ChainHead
from auditchain.services import link_entries, trim_through, verify_log, verify_since_last
from auditchain.verification import BROKEN, REMOVED, UNLINKED, findings
from broker import audit
from broker.audit import Actor
from broker.models import AuditEntry

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])
OFFICER = Actor("user", "audrey")


def sql(statement: str, parameters=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, parameters)


def problems() -> list[tuple[int, str]]:
    return [(finding.entry_id, finding.problem) for finding in findings()]


@pytest.fixture
def linked() -> list[int]:
    """Six entries, written by three writers' transactions, linked."""
    for n in range(3):
        audit.record_change(actor=OFFICER, action="policy.set", target=f"client:web-{n}")
    audit.record_changes([audit.Change(OFFICER, "attributes.state", "client:web-9", {"n": n})
                          for n in range(3)])  # fmt: skip
    assert link_entries().entries == 6
    return list(AuditEntry.objects.order_by("id").values_list("id", flat=True))


def test_entries_are_linked_once_in_the_order_they_were_written_and_verify(linked):
    assert list(AuditLink.objects.order_by("position").values_list("entry_id", flat=True)) == linked
    audit.record_change(actor=OFFICER, action="policy.set", target="client:web-7")
    assert link_entries().entries == 1 and link_entries().entries == 0
    assert ChainHead.objects.get().position == 7
    assert problems() == []


def test_an_entry_deleted_is_found_by_its_link(linked):
    sql("DELETE FROM broker_auditentry WHERE id = %s", [linked[2]])
    assert problems() == [(linked[2], REMOVED)]


def test_an_entry_deleted_with_its_link_breaks_the_chain_there(linked):
    sql("DELETE FROM broker_auditentry WHERE id = %s", [linked[2]])
    sql("DELETE FROM auditchain_auditlink WHERE entry_id = %s", [linked[2]])
    assert problems() == [(linked[3], BROKEN), (linked[3], BROKEN)]  # a gap, a code


def test_links_renumbered_after_a_deletion_still_break_where_it_was(linked):
    sql("DELETE FROM broker_auditentry WHERE id = %s", [linked[2]])
    sql("DELETE FROM auditchain_auditlink WHERE entry_id = %s", [linked[2]])
    sql("UPDATE auditchain_auditlink SET position = position - 1 WHERE position > 3")
    assert problems() == [(linked[3], BROKEN)]


def test_an_entry_slipped_in_behind_the_chain_is_found(linked):
    head = ChainHead.objects.get()
    sql(
        "INSERT INTO broker_auditentry (at, actor, action, target, outcome, reason, details,"
        " mac, txid) SELECT at, actor, action, 'client:web-0', outcome, reason, details, mac,"
        " %s FROM broker_auditentry WHERE id = %s", [head.horizon - 1, linked[0]],
    )  # fmt: skip
    slipped = AuditEntry.objects.latest("id").id
    link_entries()
    assert (slipped, UNLINKED) in problems()


def test_the_hourly_verification_reads_only_what_came_since_and_keeps_what_it_found(
    linked, monkeypatch
):
    assert verify_since_last().found == 0  # the first: everything
    checked = []
    original = verification._finding
    counted = lambda entry, secrets: checked.append(entry.id) or original(entry, secrets)  # noqa: E731
    monkeypatch.setattr(verification, "_finding", counted)
    audit.record_change(actor=OFFICER, action="policy.set", target="client:web-8")
    sql(
        "INSERT INTO broker_auditentry (at, actor, action, target, outcome, reason, details)"
        " VALUES (now(), 'user:audrey', 'policy.set', 'client:web-9', 'done', '', '{}')"
    )
    link_entries()
    new = [e.id for e in AuditEntry.objects.filter(id__gt=linked[-1]).order_by("id")]
    outcome = verify_since_last()
    assert sorted(checked) == new and outcome.found == 1
    assert verify_since_last().found == 0  # nothing new
    assert ChainHead.objects.get().findings == 1  # it does not verify until a full run says so


def test_an_entry_changed_after_it_was_verified_is_found_by_the_full_verification(linked):
    verify_since_last()
    sql("UPDATE broker_auditentry SET reason = 'rewritten' WHERE id = %s", [linked[0]])
    assert verify_since_last().found == 0
    assert [f.entry_id for f in verify_log().listed] == [linked[0]]


def test_a_log_trimmed_by_retention_verifies_from_its_new_start(linked):
    assert trim_through(position=4) == 4

    assert list(AuditEntry.objects.order_by("id").values_list("id", flat=True)) == linked[4:]
    assert AuditLink.objects.order_by("position").first().position == 5
    assert problems() == []
    assert verify_log().found == 0 and verify_since_last().found == 0
    assert trim_through(position=4) == 0  # done already


def test_a_start_moved_by_hand_to_hide_entries_removed_after_it_is_found(linked):
    trim_through(position=2)
    # Entries 3 and 4 removed with their links, and the start moved past them: the
    # chain from there on holds, the start's own code does not.
    chain = AuditLink.objects.get(position=4).chain
    sql("DELETE FROM broker_auditentry WHERE id IN (%s, %s)", linked[2:4])
    sql("DELETE FROM auditchain_auditlink WHERE position IN (3, 4)")
    sql("UPDATE auditchain_chainhead SET start_position = 4, start_chain = %s", [chain])

    assert problems() == [(0, BROKEN)]
