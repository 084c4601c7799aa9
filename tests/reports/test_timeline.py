"""The timeline report against the database: events and deliveries per minute, the
senders, and the changes marked on the same axis."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from broker.models import AttributeHistory, AuditEntry, Client, PolicyVersion
from reports.jobs import timeline
from reports.results import Params
from tests.reports import expected
from tests.reports.incident import ALERTS_ONLY, READING_MARKS

pytestmark = READING_MARKS

# The incident's changes and the marks they make (those the incident does not make are
# not listed: then the report's marks would include actions this test does not know).
MARKS = {
    "event.send": "send",
    "policy.set": "policy",
    "attributes.attest": "trust",
    "attributes.revoke": "trust",
    "grant.create": "trust",
    "authority.create": "trust",
}


def minute(moment: datetime) -> str:
    return expected.iso(moment.replace(second=0, microsecond=0))


def region_clients(params: Params) -> set[int]:
    return {pk for pk, region in expected.regions().items() if region == params.region}


def expected_series(params: Params) -> list[dict]:
    deliveries = Counter(d.event_id for d in expected.deliveries(params))
    cells: dict[tuple, list[int]] = {}
    for event in expected.window_events(params):
        if params.region and not deliveries[event.pk]:
            continue
        key = (minute(event.published_at), event.content["kind"], event.sender.name, event.channel)
        cell = cells.setdefault(key, [0, 0])
        cell[0] += 1
        cell[1] += deliveries[event.pk]
    return [
        dict(zip(("bucket", "kind", "sender", "channel"), key, strict=True))
        | {"events": events, "deliveries": count}
        for key, (events, count) in sorted(cells.items())
    ]


def expected_senders(params: Params) -> list[dict]:
    deliveries = Counter(d.event_id for d in expected.deliveries(params))
    events = [e for e in expected.window_events(params) if not params.region or deliveries[e.pk]]
    rows = []
    for sender, sent in expected.by(events, lambda e: e.sender.name).items():
        rows.append(
            {
                "sender": sender,
                "events": len(sent),
                "deliveries": sum(deliveries[e.pk] for e in sent),
                "first": expected.iso(min(e.published_at for e in sent)),
                "last": expected.iso(max(e.published_at for e in sent)),
            }
        )
    return sorted(rows, key=lambda r: (-r["deliveries"], -r["events"], r["sender"]))


def expected_markers(params: Params) -> list[tuple]:
    entries = AuditEntry.objects.filter(
        at__gte=params.window_start, at__lt=params.window_end, outcome="done"
    ).order_by("at", "id")
    names = set(Client.objects.filter(pk__in=region_clients(params)).values_list("name", flat=True))
    marks = []
    for entry in entries:
        about_a_client = entry.target.startswith("client:")
        if params.region and about_a_client and entry.target[len("client:") :] not in names:
            continue
        if entry.action in MARKS:
            marks.append(
                (
                    expected.iso(entry.at),
                    MARKS[entry.action],
                    entry.action,
                    entry.actor,
                    entry.target,
                )
            )
    return marks


def expected_changes(params: Params) -> list[dict]:
    chosen = region_clients(params) if params.region else None

    def counted(rows) -> Counter:
        in_window = (r for r in rows if params.window_start <= r[0] < params.window_end)
        return Counter(minute(at) for at, client in in_window if chosen is None or client in chosen)

    policies = counted(PolicyVersion.objects.values_list("created_at", "client_id"))
    history = AttributeHistory.objects
    attested = counted(
        history.filter(source="authority", kind__in=["set", "renewed"]).values_list(
            "at", "client_id"
        )
    )
    revoked = counted(history.filter(kind="revoked").values_list("at", "client_id"))
    return [
        {
            "bucket": bucket,
            "policy_versions": policies[bucket],
            "attestations": attested[bucket],
            "revocations": revoked[bucket],
        }
        for bucket in sorted(set(policies) | set(attested) | set(revoked))
    ]


def assert_matches_the_database(result, params: Params) -> None:
    assert result.summary["bucket_s"] == 60  # an hour's window: one-minute buckets
    assert result.sections["series"] == expected_series(params)
    assert result.sections["senders"] == expected_senders(params)
    marks = [
        (m["at"], m["type"], m["action"], m["actor"], m["target"])
        for m in result.sections["markers"]
    ]
    assert marks == expected_markers(params)
    assert result.summary["markers"] == len(marks)
    assert result.sections["changes"] == expected_changes(params)


def test_the_timeline_counts_events_deliveries_and_changes_per_minute(incident):
    result = timeline.run(incident.data, incident.params)

    assert_matches_the_database(result, incident.params)
    assert result.summary["events"] == 5
    what = {(m["action"], m["target"]): m["what"] for m in result.sections["markers"]}
    assert what[("policy.set", f"client:{ALERTS_ONLY}")] == "version 2"
    assert what[("attributes.revoke", "client:rogue-controller")] == 'revoked ["trust"]'
    assert what[("attributes.attest", "client:northwest-controller")] == 'attested {"trust":3}'
    status = incident.events["status"]
    assert what[("event.send", f"event:{status.pk}")] == "as intellimune-national to 39 accepting"
    assert sum(row["revocations"] for row in result.sections["changes"]) == 1


def test_a_regions_timeline_counts_only_what_reached_it_and_changes_about_it(incident):
    window = incident.params
    params = Params(window.window_start, window.window_end, "Northeast")

    result = timeline.run(incident.data, params)

    assert_matches_the_database(result, params)
    # Only the status command reached the Northeast (10 of its servers).
    assert [(r["sender"], r["events"], r["deliveries"]) for r in result.sections["senders"]] == [
        ("intellimune-national", 1, 10)
    ]


def test_a_window_without_events_gives_empty_sections_and_a_wider_bucket(incident):
    params = Params(
        datetime(2001, 1, 1, tzinfo=UTC), datetime(2001, 1, 1, tzinfo=UTC) + timedelta(days=30)
    )

    result = timeline.run(incident.data, params)

    assert all(rows == [] for rows in result.sections.values())
    assert result.summary["events"] == result.summary["deliveries"] == 0
    assert result.summary["bucket_s"] == 6 * 3600  # 30 days in 120 buckets


def test_totals_count_every_event_when_the_senders_section_is_cut(incident, monkeypatch):
    whole = timeline.run(incident.data, incident.params)
    monkeypatch.setattr(timeline, "MAX_ROWS", 1)

    cut = timeline.run(incident.data, incident.params)

    assert len(cut.sections["senders"]) == 1 < len(whole.sections["senders"])
    assert (cut.summary["events"], cut.summary["deliveries"]) == (
        whole.summary["events"],
        whole.summary["deliveries"],
    )
