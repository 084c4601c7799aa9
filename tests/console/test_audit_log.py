"""The Audit log page: filters, paging and order, links to the objects, the CSV export
(every match, formula-safe, itself audited), and who may read it."""

from __future__ import annotations

import csv
import io
import json
import re
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from django.urls import reverse
from django.utils import timezone

from auditchain.models import AuditLink
from auditchain.services import link_entries, verify_log
from broker.audit import entry_code
from broker.models import AuditEntry
from tests.cast import ADMINISTRATOR, AUDITOR, create_member
from tests.console.conftest import logged_in

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

EVENT_ID = "6f1c2c4e-8a51-4c1e-9a55-3f0d2f6f1a10"
HOUR = timedelta(hours=1)


def entry(hours_ago: float, actor: str, action: str, target: str = "", **fields) -> AuditEntry:
    """An audit entry written `hours_ago` hours ago, with its code as the console
    makes it."""
    written = AuditEntry(
        at=timezone.now() - hours_ago * HOUR,
        actor=actor,
        action=action,
        target=target,
        outcome=fields.pop("outcome", "done"),
        **fields,
    )
    written.mac = entry_code(written)
    written.save()
    return written


@pytest.fixture
def log():
    """A small log, newest first: a refusal by a sender's receivers, a policy set by
    selector, a publish, an attestation and an operator's token revocation."""
    return [
        entry(1, "client:rogue-controller", "event.refused_by_policy", f"event:{EVENT_ID}",
              outcome="refused", reason="3 receivers addressed here refuse this sender",
              details={"leaf": 4, "receivers": {"names": ["web-00000", "web-00004"],
                                                "unlisted": 1}}),
        entry(2, "user:paula", "policy.set", "clients:12",
              details={"selection": 'region == "Northwest"', "policy": "accept true"}),
        entry(3, "client:northwest-controller", "event.publish", "client:northwest-controller"),
        entry(4, "authority:trust-manager", "attributes.attest", "client:web-00042"),
        entry(5, "user:olivia", "client.revoke_tokens", "client:web-00042"),
    ]  # fmt: skip


def audit_page(client, **params) -> str:
    response = client.get(reverse("audit-log"), params)
    assert response.status_code == 200, response.content
    return response.content.decode()


def rows(body: str) -> list[int]:
    """The entries a page shows, in its order."""
    return [int(pk) for pk in re.findall(r'data-entry="(\d+)"', body)]


def ids(entries) -> list[int]:
    return [e.pk for e in entries]


def shown_of(body: str, log) -> list[int]:
    """The page's rows that are entries of `log` (the viewer's own login is there too)."""
    ours = set(ids(log))
    return [pk for pk in rows(body) if pk in ours]


# Who may read it


def test_an_auditor_reads_the_log_newest_first(as_auditor, log):
    body = audit_page(as_auditor)
    assert shown_of(body, log) == ids(log)
    assert "client:rogue-controller" in body and "3 receivers addressed here refuse" in body


def test_an_admin_reads_the_log(client, log):
    logged_in(client, ADMINISTRATOR)
    assert shown_of(audit_page(client), log) == ids(log)


def test_an_operator_is_refused_the_page_and_the_export_and_both_are_audited(as_operator, log):
    assert as_operator.get(reverse("audit-log")).status_code == 403
    assert as_operator.get(reverse("audit-export")).status_code == 403
    refusals = AuditEntry.objects.using("audit").filter(actor="user:olivia", outcome="refused")
    assert sorted(refusals.values_list("action", flat=True)) == ["audit.export", "audit.view"]
    assert {refusal.details["category"] for refusal in refusals} == {"role_refused"}


def test_the_navigation_links_the_log_only_for_those_who_may_read_it(as_operator, client):
    assert 'href="/audit/"' not in as_operator.get(reverse("home")).content.decode()
    client.logout()
    logged_in(client, AUDITOR)
    assert 'href="/audit/"' in client.get(reverse("home")).content.decode()


# Filters


def test_filtering_by_an_exact_actor(as_auditor, log):
    body = audit_page(as_auditor, actor="user:paula")
    assert rows(body) == [log[1].pk]


@pytest.mark.parametrize("actor", ["client:", "client:*"])
def test_filtering_by_an_actors_kind(as_auditor, log, actor):
    assert rows(audit_page(as_auditor, actor=actor)) == [log[0].pk, log[2].pk]


@pytest.mark.parametrize("action", ["event.", "event.*"])
def test_filtering_by_an_action_prefix(as_auditor, log, action):
    assert rows(audit_page(as_auditor, action=action)) == [log[0].pk, log[2].pk]


def test_filtering_by_an_exact_action(as_auditor, log):
    assert rows(audit_page(as_auditor, action="event.publish")) == [log[2].pk]


def test_filtering_by_an_exact_target_and_by_a_part_of_it(as_auditor, log):
    assert rows(audit_page(as_auditor, target="client:web-00042")) == [log[3].pk, log[4].pk]
    assert rows(audit_page(as_auditor, target="client:web-0004")) == []
    assert rows(audit_page(as_auditor, target="*web-0004*")) == [log[3].pk, log[4].pk]
    assert rows(audit_page(as_auditor, target="*controller")) == [log[2].pk]


def test_like_characters_in_a_filter_are_plain_text(as_auditor, log):
    entry(6, "user:x_y", "console.login", "console")
    entry(6, "user:xzy", "console.login", "console")
    assert len(rows(audit_page(as_auditor, actor="user:x_*"))) == 1
    assert rows(audit_page(as_auditor, target="%")) == []


def test_filtering_by_outcome(as_auditor, log):
    assert shown_of(audit_page(as_auditor, outcome="refused"), log) == [log[0].pk]
    assert shown_of(audit_page(as_auditor, outcome="done"), log) == ids(log[1:])


def test_filtering_by_a_time_window(as_auditor, log):
    now = timezone.now()
    window = {"from": (now - 4.5 * HOUR).isoformat(), "to": (now - 1.5 * HOUR).isoformat()}
    assert rows(audit_page(as_auditor, **window)) == ids(log[1:4])


def test_a_time_written_as_the_browser_does_includes_its_whole_minute(as_auditor):
    moment = (timezone.now() - 30 * HOUR).replace(second=30, microsecond=0)
    inside = entry(30, "user:x", "console.login", "console")
    AuditEntry.objects.filter(pk=inside.pk).update(at=moment)
    minute = moment.strftime("%Y-%m-%dT%H:%M")
    assert rows(audit_page(as_auditor, **{"from": minute, "to": minute})) == [inside.pk]


def test_a_date_alone_as_to_includes_that_whole_day(as_auditor):
    late = entry(0, "user:x", "console.login", "console")
    AuditEntry.objects.filter(pk=late.pk).update(at=late.at.replace(hour=23, minute=59))
    day = late.at.date().isoformat()
    assert rows(audit_page(as_auditor, **{"from": day, "to": day, "actor": "user:x"})) == [late.pk]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01T10:00"}, "to"),
        ({"from": "2026-05-02", "to": "2026-05-01"}, "to"),
        ({"outcome": "maybe"}, "outcome"),
        ({"after": "twelve"}, "after"),
        ({"after": "999999999"}, "after"),
        ({"actor": "x" * 201}, "actor"),
    ],
)
def test_a_filter_that_cannot_be_read_is_a_400_naming_it(as_auditor, params, field):
    response = as_auditor.get(reverse("audit-log"), params)
    body = response.content.decode()
    assert response.status_code == 400
    assert f'data-field="{field}"' in body and f"<strong>{field}:</strong>" in body


def test_a_bad_time_asked_by_htmx_answers_the_results_fragment_with_400(as_auditor):
    response = as_auditor.get(
        reverse("audit-log"), {"from": "soon"}, headers={"HX-Request": "true"}
    )
    body = response.content.decode()
    assert response.status_code == 400
    assert "<html" not in body and "from:" in body and "is not a date and time" in body


def test_the_export_of_a_bad_filter_is_a_400_naming_it(as_auditor):
    response = as_auditor.get(reverse("audit-export"), {"to": "noon"})
    assert response.status_code == 400 and response.content.decode().startswith("to:")


# Paging and order


@pytest.fixture
def long_log():
    """120 entries by two clients, an hour apart, newest first."""
    return [entry(n + 1, f"client:{'ann' if n % 2 else 'bob'}", "client.login", "console")
            for n in range(120)]  # fmt: skip


def follow(client, body: str, rel: str) -> str:
    link = re.search(rf'href="(\?[^"]*)"[^>]*rel="{rel}"', body)
    assert link, f"no {rel} link"
    return audit_page(client, **dict(_pairs(link[1])))


def _pairs(query: str):
    from urllib.parse import parse_qsl

    return parse_qsl(query.removeprefix("?").replace("&amp;", "&"))


def test_pages_of_fifty_follow_one_another_and_back(as_auditor, long_log):
    first = audit_page(as_auditor, actor="client:*")
    second = follow(as_auditor, first, "next")
    third = follow(as_auditor, second, "next")
    assert rows(first) == ids(long_log[:50])
    assert rows(second) == ids(long_log[50:100])
    assert rows(third) == ids(long_log[100:])
    assert 'rel="next"' not in third
    assert rows(follow(as_auditor, third, "prev")) == ids(long_log[50:100])
    assert rows(follow(as_auditor, second, "prev")) == ids(long_log[:50])


def test_a_page_continues_where_the_last_ended_though_entries_were_added(as_auditor, long_log):
    first = audit_page(as_auditor, actor="client:*")
    entry(0, "user:carl", "console.login", "console")
    assert rows(follow(as_auditor, first, "next")) == ids(long_log[50:100])


@pytest.mark.parametrize("order", ["-at", "at", "actor", "-action"])
def test_entries_written_at_the_same_moment_are_paged_each_once(as_auditor, order):
    moment = timezone.now() - HOUR
    AuditEntry.objects.bulk_create(
        AuditEntry(at=moment, actor="client:twin", action="client.login", outcome="done")
        for _ in range(70)
    )
    first = audit_page(as_auditor, actor="client:twin", sort=order)
    second = follow(as_auditor, first, "next")
    assert len(rows(first)) == 50 and len(rows(second)) == 20
    assert len(set(rows(first)) | set(rows(second))) == 70
    assert rows(follow(as_auditor, second, "prev")) == rows(first)


def test_the_count_says_how_many_match(as_auditor, long_log):
    assert 'data-total="60"' in audit_page(as_auditor, actor="client:ann")


@pytest.mark.parametrize(
    ("order", "actors"),
    [("actor", ["client:ann", "client:bob"]), ("-actor", ["client:bob", "client:ann"])],
)
def test_sorting_by_actor_groups_each_actors_entries_newest_first(
    as_auditor, long_log, order, actors
):
    pages = [audit_page(as_auditor, actor="client:*", sort=order)]
    while 'rel="next"' in pages[-1]:
        pages.append(follow(as_auditor, pages[-1], "next"))
    shown = [pk for page in pages for pk in rows(page)]
    expected = [e.pk for actor in actors for e in long_log if e.actor == actor]
    assert shown == expected


def test_sorting_by_time_oldest_first_and_by_action(as_auditor, log):
    assert shown_of(audit_page(as_auditor, sort="at"), log) == ids(log)[::-1]
    by_action = shown_of(audit_page(as_auditor, sort="action"), log)
    assert [AuditEntry.objects.get(pk=pk).action for pk in by_action] == sorted(
        e.action for e in log
    )


def test_an_unknown_order_falls_back_to_the_newest_first(as_auditor, log):
    assert shown_of(audit_page(as_auditor, sort="reason"), log) == ids(log)


def test_a_page_takes_the_same_few_queries_however_long_the_log(
    as_auditor, long_log, django_assert_max_num_queries
):
    first = audit_page(as_auditor)
    # The session, the user, the device that proved their second factor, their
    # permissions (2) and roles; the chain's state and newest checkpoint; the count, the
    # entry the page starts after, and the page (its rows at that entry's time, then
    # before it).
    with django_assert_max_num_queries(12):
        follow(as_auditor, first, "next")


# Links


def test_clicking_an_actor_action_or_target_filters_by_it(as_auditor, log):
    body = audit_page(as_auditor)
    assert 'href="?actor=user%3Apaula"' in body
    assert 'href="?action=event.publish"' in body
    assert 'href="?target=client%3Aweb-00042"' in body


def test_a_filter_link_keeps_the_other_filters_and_the_order(as_auditor, log):
    body = audit_page(as_auditor, outcome="done", sort="actor")
    assert 'href="?actor=user%3Apaula&amp;outcome=done&amp;sort=actor"' in body


def test_clients_authorities_and_selections_link_to_their_pages(as_auditor, log):
    body = audit_page(as_auditor)
    assert f'href="{reverse("client", args=["web-00042"])}" class="open"' in body
    assert f'href="{reverse("client", args=["northwest-controller"])}" class="open"' in body
    assert f'href="{reverse("trust")}" class="open"' in body
    assert 'href="/fleet/?q=region+%3D%3D+%22Northwest%22" class="open"' in body


def test_an_event_links_to_its_page(as_auditor, log):
    assert f'href="/events/{EVENT_ID}/" class="open"' in audit_page(as_auditor)


def test_long_lists_of_names_in_details_are_said_as_a_count(as_auditor, log):
    body = audit_page(as_auditor, action="event.refused_by_policy")
    assert "3: web-00000, web-00004" in body


# The page's states


def test_with_no_match_the_page_says_how_to_find_some(as_auditor, log):
    body = audit_page(as_auditor, actor="user:nobody")
    assert "No entry matches these filters" in body and 'href="/audit/"' in body


def test_a_filtered_view_is_a_link_the_form_and_export_keep(as_auditor, log):
    body = audit_page(as_auditor, actor="user:paula", outcome="done")
    assert 'name="actor" value="user:paula"' in body
    assert 'href="/audit/export.csv?actor=user%3Apaula&amp;outcome=done"' in body


def test_results_asked_for_by_a_link_bring_the_form_up_to_date(as_auditor, log):
    by_link = as_auditor.get(
        reverse("audit-log"), {"actor": "user:paula"}, headers={"HX-Request": "true"}
    ).content.decode()
    by_form = as_auditor.get(
        reverse("audit-log"),
        {"actor": "user:paula"},
        headers={"HX-Request": "true", "HX-Trigger": "audit-filters"},
    ).content.decode()
    assert "<html" not in by_link
    assert 'hx-swap-oob="true"' in by_link and 'value="user:paula"' in by_link
    assert 'id="audit-filters"' not in by_form


# The CSV export


def export(client, **params) -> list[dict]:
    response = client.get(reverse("audit-export"), params)
    assert response.status_code == 200
    assert response.streaming and response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="audit-log-')
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


def test_the_export_has_every_matching_entry_not_just_a_page(as_auditor, long_log):
    exported = export(as_auditor, actor="client:ann")
    assert len(exported) == 60
    assert [row["actor"] for row in exported] == ["client:ann"] * 60


def test_the_export_writes_each_column_and_the_details_as_json(as_auditor, log):
    (row,) = export(as_auditor, action="event.refused_by_policy")
    assert row["actor"] == "client:rogue-controller" and row["outcome"] == "refused"
    assert row["target"] == f"event:{EVENT_ID}"
    assert json.loads(row["details"])["receivers"]["names"] == ["web-00000", "web-00004"]
    assert row["at"] == timezone.localtime(log[0].at).isoformat()


def test_the_export_keeps_cells_from_running_as_formulas(as_auditor):
    entry(1, "=cmd|' /C calc'!A0", "console.login", "+1", reason="-2+3", outcome="refused")
    entry(2, "@SUM(1)", "console.login", "console")
    exported = export(as_auditor, action="console.login", sort="at")
    assert [row["actor"] for row in exported][:2] == ["'@SUM(1)", "'=cmd|' /C calc'!A0"]
    assert exported[1]["target"] == "'+1" and exported[1]["reason"] == "'-2+3"


def test_the_export_is_audited_with_who_and_what_filter(as_auditor, log):
    export(as_auditor, actor="client:*", outcome="refused")
    recorded = AuditEntry.objects.get(action="audit.export")
    assert recorded.actor == "user:audrey" and recorded.target == "audit-log"
    assert recorded.details == {
        "format": "csv",
        "filter": {"actor": "client:*", "outcome": "refused"},
    }


def test_the_export_streams_under_asgi_as_under_wsgi(log):
    client = AsyncClient()
    client.force_login(create_member(AUDITOR))
    response = async_to_sync(client.get)(reverse("audit-export"), {"actor": "user:*"})

    async def read(response) -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    assert response.is_async
    exported = list(csv.DictReader(io.StringIO(async_to_sync(read)(response).decode())))
    assert {row["actor"] for row in exported} >= {"user:paula", "user:olivia"}


def test_an_event_target_is_filterable_by_its_id(as_auditor, log):
    event = uuid.UUID(EVENT_ID)
    assert rows(audit_page(as_auditor, target=f"event:{event}")) == [log[0].pk]


# Committed: entries are linked once the transactions that wrote them have ended.
@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_the_page_says_whether_the_log_verifies_and_names_the_first_finding(
    as_auditor, log, settings, tmp_path
):
    settings.SIGNING_KEYS_DIR = str(tmp_path)  # no audit key here: no checkpoint expected
    assert 'data-chain="unverified"' in audit_page(as_auditor)
    link_entries()
    verify_log()
    page = audit_page(as_auditor)
    assert 'data-chain="verified"' in page and "each as the console wrote it" in page
    AuditEntry.objects.filter(pk=log[1].pk).update(actor="user:mallory")
    verify_log()
    page = audit_page(as_auditor)
    assert 'data-chain="broken"' in page and f"entry {log[1].pk} " in page


# Committed: entries are linked once the transactions that wrote them have ended.
@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_the_export_carries_each_entrys_code_and_link(as_auditor, log):
    link_entries()
    exported = {int(row["id"]): row for row in export(as_auditor)}
    links = dict(AuditLink.objects.values_list("entry_id", "position"))
    for written in log:
        row = exported[written.pk]
        assert row["mac"] == written.mac and len(row["mac"]) == 64
        assert int(row["link"]) == links[written.pk] and len(row["chain"]) == 64
