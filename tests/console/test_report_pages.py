"""The Reports pages: who may read and run them, the filters read and refused naming the
field, a run shown queued, running, failed and done, the tables paged and sorted on the
server, the CSV of a section (formula-safe, audited), and what an empty page says.

Runs and their rows are made through reports.services as the worker makes them (the
rows in the reach job's section shapes)."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse
from django.utils import timezone

from broker.audit import Actor
from broker.models import AuditEntry
from reports import services
from reports.filters import query_of
from reports.jobs.reach import SECTIONS
from reports.models import ReportRun
from reports.results import Params, Result
from tests.cast import ADMINISTRATOR, AUDITOR, OPERATOR, POLICY_AUTHOR, TRUST_OFFICER
from tests.console.conftest import logged_in

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

OLIVIA = Actor("user", "olivia")
END = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
WINDOW = Params(window_start=END - timedelta(hours=6), window_end=END)
EXPORTED_BEFORE = timedelta(minutes=3)  # how long before a run ends its data was exported


def iso(moment: datetime) -> str:
    """A time as the jobs write it (Spark's ISO 8601, UTC)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def command(number: int, *, targeted: int = 10, t99_s: float | None = None) -> dict:
    """A row of the reach report's `commands` section."""
    acked = max(targeted - 3, 0)
    return {
        "event": f"6f1c2c4e-8a51-4c1e-9a55-{number:012d}",
        "published_at": iso(WINDOW.window_start + timedelta(minutes=number)),
        "sender": "intellimune-national",
        "kind": "command",
        "action": f"action-{number:02d}",
        "selector": "vulnerable == true",
        "targeted": targeted, "delivered": targeted - 1, "acked_ok": acked, "failed": 1,
        "no_answer": 1, "expired": 1, "t50_s": 0.25 * number, "t90_s": 0.5 * number,
        "t99_s": t99_s,
    }  # fmt: skip


def reach_result(commands: list[dict]) -> Result:
    regions = [{**{k: row[k] for k in row if k in SECTIONS["regions"].field_names},
                "region": "Northwest"} for row in commands]  # fmt: skip
    missed = [
        {"event": row["event"], "receiver": "web-00005", "region": "Northwest",
         "state": "expired", "delivered_at": row["published_at"]}
        for row in commands
    ]  # fmt: skip
    summary = {"events": len(commands), "targeted": sum(r["targeted"] for r in commands)}
    return Result(
        summary={**summary, "rows_limit": 10_000, "region": ""},
        sections={"commands": commands, "regions": regions, "never_answered": missed},
    )


def requested(kind: str = "reach", params: Params = WINDOW) -> ReportRun:
    return services.request_run(kind=kind, params=params, actor=OLIVIA)


def done_run(result: Result, *, kind: str = "reach", params: Params = WINDOW) -> ReportRun:
    """A run as the worker leaves it when it succeeds."""
    run = requested(kind, params)
    services.claim_run(run.pk)
    timings = {"export": 0.4, "startup": 0.0, "job": 2.5}
    exported_at = timezone.now() - EXPORTED_BEFORE
    services.store_result(run_id=run.pk, result=result, data_as_of=exported_at, timings=timings)
    run.refresh_from_db()
    return run


def page_url(kind: str = "reach", params: Params = WINDOW, **extra: str) -> str:
    query = {**query_of(params), **extra}
    return reverse("report", args=[kind]) + "?" + "&".join(f"{k}={v}" for k, v in query.items())


def body_of(response) -> str:
    return response.content.decode()


def table_rows(body: str, section: str) -> list[list[str]]:
    """The text of each cell of each row of a section's table."""
    table = re.search(rf'<table[^>]*data-section="{section}".*?</table>', body, re.S)
    assert table, f"no table of {section}"
    rows = re.findall(r"<tbody>(.*?)</tbody>", table[0], re.S)[0]
    return [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", rows, re.S)
    ]


def refusals(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.using("audit").filter(action=action, outcome="refused"))


# --- who may read and run ---------------------------------------------------------


@pytest.mark.parametrize("member", [OPERATOR, POLICY_AUTHOR, TRUST_OFFICER, AUDITOR])
def test_every_role_reads_the_reports_and_their_link_is_in_the_navigation(client, member):
    logged_in(client, member)
    index = client.get(reverse("reports"))
    assert index.status_code == 200
    assert 'href="/reports/"' in body_of(index)
    assert client.get(reverse("report", args=["reach"])).status_code == 200


def test_the_audit_review_is_refused_to_an_operator_saying_which_role_and_audited(client):
    logged_in(client, OPERATOR)
    done = done_run(Result(), kind="audit")
    assert client.get(reverse("report", args=["audit"])).status_code == 403
    response = client.get(reverse("report-csv", args=[done.pk, "refusals"]))
    assert response.status_code == 403
    assert "auditor" in body_of(response)
    assert client.post(reverse("report-run", args=["audit"]), query_of(WINDOW)).status_code == 403
    actions = {e.action for e in AuditEntry.objects.using("audit").filter(outcome="refused")}
    assert actions == {"report.view", "report.export", "report.run"}


def test_the_index_marks_the_audit_review_for_auditors_only_to_an_operator(client):
    logged_in(client, OPERATOR)
    body = body_of(client.get(reverse("reports")))
    assert 'href="/reports/reach/' in body
    assert 'href="/reports/audit/' not in body
    assert "auditor only" in body


def test_an_auditor_reads_the_audit_review(as_auditor):
    assert as_auditor.get(reverse("report", args=["audit"])).status_code == 200


def test_a_role_that_may_not_run_reports_is_refused_and_sees_no_run_button(as_author):
    page = body_of(as_author.get(page_url()))
    assert "data-run-report" not in page
    response = as_author.post(reverse("report-run", args=["reach"]), query_of(WINDOW))
    assert response.status_code == 403
    assert not ReportRun.objects.exists()
    assert [e.reason for e in refusals("report.run")] == [
        "paula lacks the operator or auditor role (reports.add_reportrun)"
    ]


def test_an_operator_runs_a_report_and_lands_on_its_page_with_its_filters(as_operator):
    response = as_operator.post(reverse("report-run", args=["reach"]), query_of(WINDOW))
    assert response.status_code == 302
    assert response["Location"] == page_url()
    run = ReportRun.objects.get()
    assert (run.kind, run.window_start, run.window_end, run.region) == (
        "reach", WINDOW.window_start, WINDOW.window_end, ""
    )  # fmt: skip
    assert run.requested_by == "user:olivia"
    assert AuditEntry.objects.filter(action="report.run", outcome="done").count() == 1


def test_a_run_started_with_htmx_sends_the_browser_to_its_page(as_operator):
    response = as_operator.post(
        reverse("report-run", args=["reach"]), query_of(WINDOW), HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == page_url()


def test_a_run_for_one_region_keeps_it(as_operator, region_northwest):
    params = Params(WINDOW.window_start, WINDOW.window_end, "Northwest")
    response = as_operator.post(reverse("report-run", args=["reach"]), query_of(params))
    assert response.status_code == 302
    assert ReportRun.objects.get().region == "Northwest"
    assert "region=Northwest" in response["Location"]


@pytest.fixture
def region_northwest():
    """One server in the Northwest, so that the region can be chosen."""
    from demo.scenario import load_scenario

    load_scenario(servers=2)


# --- the filters --------------------------------------------------------------------

BAD_FILTERS = [
    ({"from": "yesterday", "to": "2026-11-23T12:00"}, "from"),
    ({"from": "2026-11-23T06:00", "to": "2026-13-45T12:00"}, "to"),
    ({"from": "2026-11-23T06:00"}, "to"),
    ({"from": "2026-11-23T12:00", "to": "2026-11-23T06:00"}, "to"),
    ({"from": "2026-11-23T12:00", "to": "2026-11-23T12:00"}, "to"),
    ({"from": "2026-11-23T06:00", "to": "2026-11-23T12:00", "region": "Atlantis"}, "region"),
]


@pytest.mark.parametrize(("params", "field"), BAD_FILTERS)
def test_filters_that_cannot_be_read_are_a_400_naming_the_field(as_operator, params, field):
    response = as_operator.get(reverse("report", args=["reach"]), params)
    assert response.status_code == 400
    assert f'data-field="{field}"' in body_of(response)
    assert 'aria-invalid="true"' in body_of(response)


@pytest.mark.parametrize(("params", "field"), BAD_FILTERS)
def test_a_run_with_bad_filters_is_refused_naming_the_field_and_audited(as_operator, params, field):
    response = as_operator.post(reverse("report-run", args=["reach"]), params)
    assert response.status_code == 400
    assert f'data-field="{field}"' in body_of(response)
    assert not ReportRun.objects.exists()
    assert [e.details["field"] for e in refusals("report.run")] == [field]


def test_a_run_of_a_year_and_more_is_refused_naming_the_start(as_operator):
    params = {"from": "2024-01-01T00:00", "to": "2026-01-01T00:00"}
    response = as_operator.post(reverse("report-run", args=["reach"]), params)
    assert response.status_code == 400
    assert 'data-field="window_start"' in body_of(response)


def test_a_bad_filter_posted_with_htmx_answers_just_the_problem(as_operator):
    response = as_operator.post(
        reverse("report-run", args=["reach"]), {"from": "soon", "to": "later"},
        HTTP_HX_REQUEST="true", HTTP_HX_TARGET="report-problem",
    )  # fmt: skip
    assert response.status_code == 400
    assert body_of(response).strip().startswith('<div class="problem"')
    assert "from:" in body_of(response)


def test_a_preset_becomes_its_window_ending_now_in_the_url(as_operator):
    response = as_operator.get(reverse("report", args=["reach"]), {"preset": "6h"})
    assert response.status_code == 302
    query = parse_qs(urlsplit(response["Location"]).query)
    start = datetime.fromisoformat(query["from"][0]).replace(tzinfo=UTC)
    end = datetime.fromisoformat(query["to"][0]).replace(tzinfo=UTC)
    assert end - start == timedelta(hours=6)
    assert timedelta(0) <= end - timezone.now() <= timedelta(minutes=1)


def test_an_unknown_preset_or_report_is_refused(as_operator):
    bad_preset = as_operator.get(reverse("report", args=["reach"]), {"preset": "forever"})
    assert bad_preset.status_code == 400
    assert 'data-field="preset"' in body_of(bad_preset)
    assert as_operator.get(reverse("report", args=["forecast"])).status_code == 404


@pytest.mark.parametrize(
    "window",
    [
        {"from": "9999-12-30T00:00", "to": "9999-12-31T23:59:59"},
        {"from": "0001-01-01", "to": "0001-01-02"},
    ],
)
def test_a_window_at_the_calendars_ends_is_shown_and_refused_a_run_naming_its_field(
    as_operator, window
):
    assert as_operator.get(reverse("report", args=["reach"]), window).status_code == 200
    response = as_operator.post(reverse("report-run", args=["reach"]), window)
    assert response.status_code == 400
    assert 'data-field="window_start"' in body_of(response)
    assert not ReportRun.objects.exists()


# --- a run's states -----------------------------------------------------------------


def test_a_queued_run_says_what_it_waits_for_and_is_watched_live(as_operator):
    requested(params=Params(WINDOW.window_start - timedelta(days=1), WINDOW.window_end))
    run = requested()
    body = body_of(as_operator.get(page_url()))
    assert f'data-live-topic="report.{run.pk}"' in body
    assert 'data-run-state="queued"' in body
    assert "data-live-catch-up" in body  # what changed before the watch began is seen
    assert "Waiting for the reports worker" in body
    assert "<strong>1</strong> run is ahead of this one" in body


def test_a_running_run_shows_its_stage_and_progress(as_operator):
    run = requested()
    services.claim_run(run.pk)
    services.record_progress(run_id=run.pk, stage="Spark: 3 of 8 tasks", fraction=0.42)
    body = body_of(as_operator.get(page_url()))
    assert f'data-live-topic="report.{run.pk}"' in body
    assert 'data-run-state="running"' in body
    assert "Spark: 3 of 8 tasks" in body
    assert 'aria-valuenow="42"' in body and 'width="42.00"' in body


def test_a_failed_run_shows_its_error_first_line_first_and_offers_to_run_again(as_operator):
    run = requested()
    services.claim_run(run.pk)
    error = "FileNotFoundError: the dataset is gone\n\nTraceback (most recent call last):\n  …"
    services.fail_run(run_id=run.pk, error=error)
    body = body_of(as_operator.get(page_url()))
    assert "data-live-topic" not in body
    assert "data-run-error><strong>FileNotFoundError: the dataset is gone</strong>" in body
    assert "<summary>Where it failed</summary><pre>Traceback (most recent call last):" in body
    assert "data-run-again" in body and "Run again" in body


def test_a_failed_run_after_a_done_one_shows_both(as_operator):
    done = done_run(reach_result([command(1)]))
    failed = requested()
    services.claim_run(failed.pk)
    services.fail_run(run_id=failed.pk, error="RuntimeError: Spark died")
    body = body_of(as_operator.get(page_url()))
    assert "RuntimeError: Spark died" in body
    assert f"from run #{done.pk}" in body
    assert table_rows(body, "commands")


def test_a_done_run_shows_its_freshness_figures_charts_and_tables(as_operator):
    run = done_run(reach_result([command(1), command(2)]))
    body = body_of(as_operator.get(page_url()))
    assert 'data-run-state="done"' in body
    exported = f"{run.data_as_of:%Y-%m-%d %H:%M:%S}"
    assert f"Data exported at <strong>{exported}</strong> UTC, 3 min before the run" in body
    assert "Spark start-up none (warm)" in body and "job 2.5 s" in body
    assert "<dt>Events</dt><dd>2</dd>" in body
    for chart in ("reach.outcomes", "reach.times"):
        assert f'data-chart="{chart}"' in body
    script = rf'<script id="report-data-{run.pk}" type="application/json">(.*?)</script>'
    data = re.search(script, body)
    assert list(json.loads(data[1])["sections"]) == ["commands"]  # what the charts read
    assert len(table_rows(body, "commands")) == 2
    assert f'<a href="/events/{command(1)["event"]}/"><code' in body
    assert '<a href="/clients/web-00005/">web-00005</a>' in body
    assert f'href="/reports/runs/{run.pk}/commands.csv"' in body


def test_the_page_without_filters_shows_the_newest_run(as_operator):
    done_run(reach_result([command(1)]), params=Params(END - timedelta(days=2), END))
    newest = done_run(reach_result([command(2)]))
    body = body_of(as_operator.get(reverse("report", args=["reach"])))
    assert f'data-run="{newest.pk}"' in body
    assert 'value="2026-11-23T06:00:00"' in body


def test_the_live_part_alone_answers_the_pages_live_refresh(as_operator):
    done_run(reach_result([command(1)]))
    response = as_operator.get(page_url(), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="report-live")
    body = body_of(response)
    assert "<form" not in body.split('class="card results"')[0]
    assert 'data-chart="reach.outcomes"' in body
    assert "<html" not in body


def test_the_index_shows_each_reports_latest_run_and_when_its_data_was_exported(as_operator):
    done_run(reach_result([command(1)]))
    failed = requested(kind="latency")
    services.fail_run(run_id=failed.pk, error="RuntimeError: no")
    body = body_of(as_operator.get(reverse("reports")))
    reach_row = re.search(r'<tr data-report="reach">.*?</tr>', body, re.S)[0]
    exported = f"{ReportRun.objects.get(kind='reach').data_as_of:%Y-%m-%d %H:%M:%S}"
    assert 'data-state="done"' in reach_row and exported in reach_row
    assert f'href="{page_url()}"'.replace("&", "&amp;") in reach_row
    assert 'data-state="failed"' in re.search(r'<tr data-report="latency">.*?</tr>', body, re.S)[0]
    assert "not run yet" in re.search(r'<tr data-report="tree">.*?</tr>', body, re.S)[0]


def test_the_index_follows_the_runs_live_and_answers_htmx_with_its_table(as_operator):
    assert 'data-live-topic="reports"' in body_of(as_operator.get(reverse("reports")))
    requested()
    part = body_of(as_operator.get(reverse("reports"), HTTP_HX_REQUEST="true"))
    assert part.lstrip().startswith('<table class="grid reports">')
    assert 'data-state="queued"' in re.search(r'<tr data-report="reach">.*?</tr>', part, re.S)[0]


# --- tables: paged and sorted on the server ---------------------------------------------


@pytest.fixture
def sixty_commands():
    rows = [command(n, targeted=100 - (n * 7) % 60, t99_s=None if n % 3 else n) for n in range(60)]
    return done_run(reach_result(rows))


def test_tables_come_a_page_at_a_time_in_the_jobs_order(as_operator, sixty_commands):
    first = table_rows(body_of(as_operator.get(page_url())), "commands")
    second = table_rows(body_of(as_operator.get(page_url(**{"commands-page": "2"}))), "commands")
    third = table_rows(body_of(as_operator.get(page_url(**{"commands-page": "3"}))), "commands")
    assert (len(first), len(second), len(third)) == (25, 25, 10)
    assert "action-00" in first[0] and "action-25" in second[0] and "action-59" in third[-1]


def test_sorting_by_a_number_sorts_numerically_with_no_value_last(as_operator, sixty_commands):
    body = body_of(as_operator.get(page_url(**{"commands-sort": "-targeted"})))
    targeted = [int(row[6]) for row in table_rows(body, "commands")]
    assert targeted == sorted(targeted, reverse=True) and targeted[0] == 100
    last_page = page_url(**{"commands-sort": "t99_s", "commands-page": "3"})
    assert table_rows(body_of(as_operator.get(last_page)), "commands")[-1].count("—") == 1


def commands_sorted(client, order: str) -> list[list[str]]:
    return table_rows(body_of(client.get(page_url(**{"commands-sort": order}))), "commands")


def test_sorting_by_a_time_and_by_text(as_operator, sixty_commands):
    assert "action-59" in commands_sorted(as_operator, "-published_at")[0]
    by_action = commands_sorted(as_operator, "-action")
    assert "action-59" in by_action[0] and "action-58" in by_action[1]


def test_an_unknown_sort_field_keeps_the_jobs_order(as_operator, sixty_commands):
    assert "action-00" in commands_sorted(as_operator, "nonsense")[0]


def test_a_tables_links_keep_the_filters_and_the_other_tables_page(as_operator, sixty_commands):
    body = body_of(as_operator.get(page_url(**{"regions-page": "2"})))
    link = re.search(r'href="(\?[^"]*commands-page=2[^"]*)"', body)[1].replace("&amp;", "&")
    query = parse_qs(link[1:])
    assert query["regions-page"] == ["2"] and query["from"] == ["2026-11-23T06:00:00"]


def test_htmx_asking_for_one_table_gets_that_table_alone(as_operator, sixty_commands):
    response = as_operator.get(
        page_url(**{"commands-page": "2"}), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="table-commands"
    )
    body = body_of(response)
    assert 'data-section="commands"' in body and 'data-section="regions"' not in body
    assert "data-chart" not in body
    assert "action-25" in table_rows(body, "commands")[0]


# --- CSV -------------------------------------------------------------------------


def read_csv(response) -> list[list[str]]:
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


def test_a_sections_csv_has_its_fields_and_every_row(as_auditor, sixty_commands):
    rows = read_csv(as_auditor.get(reverse("report-csv", args=[sixty_commands.pk, "commands"])))
    assert rows[0] == SECTIONS["commands"].field_names
    assert len(rows) == 61
    first = dict(zip(rows[0], rows[1], strict=True))
    assert first["action"] == "action-00" and first["targeted"] == "100"
    assert first["published_at"] == "2026-11-23T06:00:00.000000Z" and first["t99_s"] == "0"


def test_the_csv_keeps_cells_from_running_as_formulas(as_operator):
    run = done_run(reach_result([{**command(1), "selector": '=HYPERLINK("x")'}]))
    rows = read_csv(as_operator.get(reverse("report-csv", args=[run.pk, "commands"])))
    assert rows[1][rows[0].index("selector")] == '\'=HYPERLINK("x")'


def test_a_csv_download_is_audited_with_the_run_and_section(as_operator):
    run = done_run(reach_result([command(1)]))
    as_operator.get(reverse("report-csv", args=[run.pk, "never_answered"]))
    entry = AuditEntry.objects.get(action="report.export")
    assert (entry.actor, entry.target, entry.outcome) == ("user:olivia", f"report:{run.pk}", "done")
    assert entry.details["section"] == "never_answered" and entry.details["kind"] == "reach"


def test_no_csv_for_an_unknown_section_or_an_unfinished_run(as_operator):
    run = done_run(reach_result([command(1)]))
    assert as_operator.get(reverse("report-csv", args=[run.pk, "gossip"])).status_code == 404
    queued = requested(params=Params(END, END + timedelta(hours=1)))
    assert as_operator.get(reverse("report-csv", args=[queued.pk, "commands"])).status_code == 404
    assert not AuditEntry.objects.filter(action="report.export").exists()


# --- empty states -------------------------------------------------------------------


def test_with_no_run_yet_the_page_offers_to_run_it(as_operator):
    body = body_of(as_operator.get(page_url()))
    assert "data-no-run" in body and "Run it now" in body


def test_with_no_run_yet_a_reader_who_cannot_run_is_told_who_can(as_officer):
    body = body_of(as_officer.get(page_url()))
    assert "data-no-run" in body and "An operator or auditor can run it" in body


def test_a_run_over_a_quiet_window_says_to_widen_it_or_load_traffic(as_operator):
    done_run(reach_result([]))
    body = body_of(as_operator.get(page_url()))
    assert "data-no-rows" in body
    assert "Widen the window" in body and "manage.py generate_traffic" in body
    assert "data-chart" not in body


def test_an_admin_may_do_everything(client):
    logged_in(client, ADMINISTRATOR)
    assert client.get(reverse("report", args=["audit"])).status_code == 200
    assert client.post(reverse("report-run", args=["audit"]), query_of(WINDOW)).status_code == 302
