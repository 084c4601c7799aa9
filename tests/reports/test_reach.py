"""The reach report against the database, counted as the event page counts."""

from __future__ import annotations

from datetime import UTC, datetime

from reports.jobs import reach
from reports.results import Params
from tests.reports import expected
from tests.reports.incident import READING_MARKS, RECEIVED_ONLY, SILENT

pytestmark = READING_MARKS


def expected_commands(params: Params) -> list[dict]:
    rows = expected.by(expected.deliveries(params), lambda d: d.event_id)
    commands = []
    for event in expected.window_events(params):
        if params.region and event.pk not in rows:
            continue
        mine = rows.get(event.pk, [])
        commands.append(
            {
                "event": str(event.pk),
                "published_at": expected.iso(event.published_at),
                "sender": event.sender.name,
                "kind": event.content.get("kind"),
                "action": event.content.get("action"),
                "selector": event.selector,
                **expected.tally(mine),
                **expected.times_to_acknowledge(mine),
            }
        )
    return commands


def expected_regions(params: Params) -> list[dict]:
    region_of = expected.regions()
    order = {event.pk: n for n, event in enumerate(expected.window_events(params))}
    groups = expected.by(
        expected.deliveries(params), lambda d: (d.event_id, region_of[d.receiver_id])
    )
    return [
        {
            "event": str(event_id),
            "region": region,
            **expected.tally(rows),
            **expected.times_to_acknowledge(rows),
        }
        for (event_id, region), rows in sorted(
            groups.items(), key=lambda g: (order[g[0][0]], g[0][1])
        )
    ]


def expected_never_answered(params: Params) -> list[dict]:
    region_of = expected.regions()
    rows = [
        d for d in expected.deliveries(params) if d.state in ("pending", "delivered", "expired")
    ]
    rows.sort(key=lambda d: (d.event.published_at, str(d.event_id), d.receiver.name))
    return [
        {
            "event": str(d.event_id),
            "receiver": d.receiver.name,
            "region": region_of[d.receiver_id],
            "state": d.state,
            "delivered_at": expected.iso(d.delivered_at),
        }
        for d in rows
    ]


def assert_matches_the_database(result, params: Params) -> None:
    commands = expected_commands(params)
    assert result.sections["commands"] == commands
    assert result.sections["regions"] == expected_regions(params)
    assert result.sections["never_answered"] == expected_never_answered(params)
    for name in ("targeted", "delivered", "acked_ok", "failed", "no_answer", "expired"):
        assert result.summary[name] == sum(row[name] for row in commands)
    assert result.summary["never_answered"] == len(expected_never_answered(params))


def test_each_events_reach_and_times_to_acknowledge_match_the_database(incident):
    result = reach.run(incident.data, incident.params)

    assert_matches_the_database(result, incident.params)
    rows = {row["event"]: row for row in result.sections["commands"]}
    commands = {name: rows[str(event.pk)] for name, event in incident.events.items()}
    status = commands["status"]
    # 40 servers but the one that accepts alerts only; 3 silent, 2 received only, 2 failed.
    assert (status["targeted"], status["expired"], status["no_answer"]) == (39, 3, 2)
    assert (status["acked_ok"], status["failed"]) == (32, 2)
    assert status["t50_s"] is not None and status["t90_s"] is None
    assert commands["shutdown"]["t99_s"] is not None  # both overloaded servers answered ok
    assert commands["alert"]["targeted"] == 10
    assert commands["rogue_alert"]["targeted"] == 0  # refused by every policy
    never = {(row["receiver"], row["state"]) for row in result.sections["never_answered"]}
    assert {(name, "expired") for name in SILENT} <= never
    assert {(name, "delivered") for name in RECEIVED_ONLY} <= never


def test_a_regions_report_counts_only_its_receivers(incident):
    params = Params(incident.params.window_start, incident.params.window_end, "Southeast")

    result = reach.run(incident.data, params)

    assert_matches_the_database(result, params)
    assert {row["region"] for row in result.sections["regions"]} == {"Southeast"}
    # The Northwest alert and the shutdown reached no Southeast server.
    assert [row["action"] for row in result.sections["commands"]] == ["disable-cgi", "status"]


def test_an_empty_window_gives_empty_sections(incident):
    params = Params(datetime(2001, 1, 1, tzinfo=UTC), datetime(2001, 1, 2, tzinfo=UTC))

    result = reach.run(incident.data, params)

    assert result.sections == {"commands": [], "regions": [], "never_answered": []}
    assert result.summary["events"] == result.summary["targeted"] == 0


def test_totals_count_every_event_when_the_commands_section_is_cut(incident, monkeypatch):
    whole = reach.run(incident.data, incident.params)
    monkeypatch.setattr(reach, "MAX_ROWS", 2)

    cut = reach.run(incident.data, incident.params)

    assert len(cut.sections["commands"]) == 2 < whole.summary["events"]
    assert {**cut.summary, "rows_limit": None} == {**whole.summary, "rows_limit": None}
