"""The report pages in a real Chromium against a real Uvicorn, the tree's Celery worker
and a real reports worker (Spark, the launcher's command line): after the worm
incident played through the real service, each of the five reports is started from
its page, followed live until it finishes (no reload), its charts drawn and its table
filled, and a section downloaded as CSV; a run whose job fails shows its error in the
page. Screenshots go to var/artifacts."""

from __future__ import annotations

import csv
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connections
from playwright.sync_api import expect

from broker.models import AuditEntry, Delivery, Dispatcher, Event
from console.views.reports import page_query
from reports.jobs import job
from reports.models import ReportRun
from reports.reads import UNFINISHED
from tests.browser.conftest import element_shot, log_in, shot
from tests.cast import AUDITOR, create_member
from tests.reports.incident import Incident, play_incident

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

# The first report waits for the worker's Spark to start; each then takes seconds.
RUN_TIMEOUT_MS = 180_000
UNFINISHED_STATES = '[data-run-state="queued"], [data-run-state="running"]'


@pytest.fixture
def incident(asgi_server, celery_worker, reports_worker, reports_dataset, settings) -> Incident:
    """The worm incident, exported (from this process) into the reports worker's
    dataset folder; the worker's own exports then add what changes after."""
    settings.REPORTS_DATASET = reports_dataset
    return play_incident(spark=None, root=reports_dataset)


@pytest.fixture(autouse=True)
def closes_its_connections(page):
    """The test's own reads, made while Playwright's loop runs in this thread, open a
    connection of their own: closed before the page is, or the test database could not
    be dropped at the end."""
    yield
    connections.close_all()


# Made before the page: Playwright's sync API runs an event loop in this thread.
@pytest.fixture
def auditor():
    """Audrey may read every report (the audit review too) and run them."""
    return create_member(AUDITOR)


def csv_rows(path: Path) -> tuple[list[dict], list[str]]:
    """A downloaded CSV's rows (by its header's names), and its header."""
    with path.open(newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    return [dict(zip(rows[0], row, strict=True)) for row in rows[1:]], rows[0]


@dataclass(frozen=True)
class Expected:
    """What a report's page must show: its charts, the section downloaded, and a check
    of that section's rows against the database."""

    kind: str
    charts: tuple[str, ...]
    section: str
    check: Callable[[list[dict]], None]


def every_event_once(rows: list[dict]) -> None:
    events = [str(pk) for pk in Event.objects.values_list("pk", flat=True)]
    assert sorted(row["event"] for row in rows) == sorted(events)
    targeted = {row["event"]: int(row["targeted"]) for row in rows}
    for event in Event.objects.all():
        assert targeted[str(event.pk)] == Delivery.objects.filter(event=event).count()


def events_counted_once(rows: list[dict]) -> None:
    assert sum(int(row["events"]) for row in rows) == Event.objects.count()
    assert sum(int(row["deliveries"]) for row in rows) == Delivery.objects.count()


def deliveries_by_hops(rows: list[dict]) -> None:
    delivered = Delivery.objects.filter(delivered_at__isnull=False).count()
    assert sum(int(row["delivery_count"]) for row in rows) == delivered
    assert all(row["hops"] and int(row["hops"]) >= 1 for row in rows)


def refusals_by_reason(rows: list[dict]) -> None:
    refused = AuditEntry.objects.filter(outcome="refused").count()
    assert sum(int(row["entries"]) for row in rows) == refused > 0
    assert "sender_not_qualified" in {row["category"] for row in rows}


def every_dispatcher(rows: list[dict]) -> None:
    assert sorted(row["dispatcher"] for row in rows) == sorted(
        Dispatcher.objects.values_list("name", flat=True)
    )
    assert sum(int(row["routed"]) for row in rows) > 0


EXPECTED = [
    Expected("reach", ("outcomes", "times"), "commands", every_event_once),
    Expected("timeline", ("events",), "series", events_counted_once),
    Expected("latency", ("hops", "regions"), "by_hops", deliveries_by_hops),
    Expected("audit", ("refusals", "activity"), "refusals", refusals_by_reason),
    Expected("tree", ("forwards", "loss"), "dispatchers", every_dispatcher),
]


# Five Spark runs one after the other, each allowed RUN_TIMEOUT_MS: the suite's default
# timeout (300 s) is shorter than their sum, and a loaded machine reaches it.
@pytest.mark.timeout(len(EXPECTED) * RUN_TIMEOUT_MS // 1000 + 120)
def test_each_report_runs_from_its_page_live_with_charts_tables_and_csv(
    page, asgi_server, incident, auditor
):
    log_in(page, asgi_server, AUDITOR)
    query = page_query(incident.params)
    for expected in EXPECTED:
        page.goto(f"{asgi_server}/reports/{expected.kind}/?{query}")
        expect(page.locator("[data-no-run]")).to_be_visible()
        run_and_watch(page, expected.kind)
        expect_charts_drawn(page, expected)
        refresh_as_a_late_update(page)
        expect_charts_drawn(page, expected)
        table = page.locator(f'table[data-section="{expected.section}"] tbody tr')
        expect(table.first).to_be_visible()
        shot(page, f"report-{expected.kind}")
        element_shot(page.locator(".results"), f"report-{expected.kind}-charts")
        rows, header = download_csv(page, expected.section)
        assert header == job(expected.kind).SECTIONS[expected.section].field_names
        assert rows
        expected.check(rows)
    page.goto(f"{asgi_server}/reports/")
    expect(page.locator('tr[data-report] td[data-state="done"]')).to_have_count(len(EXPECTED))
    shot(page, "reports-index")


def expect_charts_drawn(page, expected: Expected) -> None:
    for chart in expected.charts:
        drawn = page.locator(f'[data-chart="{expected.kind}.{chart}"]')
        expect(drawn.locator("canvas")).to_have_count(1)
        expect(drawn).to_have_attribute("data-drawn", "1")


def refresh_as_a_late_update(page) -> None:
    """Swap the run's part for a fresh copy, as the console socket does when an update
    arrives after the run finished: the charts are drawn again, and what the old ones
    carried (a style ECharts set on its container) is not copied onto them as inline
    style, which the Content-Security-Policy refuses (the page fixture fails on it)."""
    page.evaluate(
        "() => htmx.ajax('GET', location.href, {target: '#report-live', swap: 'innerHTML'})"
    )


def run_and_watch(page, kind: str) -> None:
    """Start the report with the page's filters, see it queued or running, and see its
    results arrive without reloading the page."""
    page.click("[data-run-report]")
    expect(page.locator(UNFINISHED_STATES).first).to_be_visible()
    page.evaluate("window.notReloaded = true")
    shot(page, f"report-{kind}-running")
    expect(page.locator('.results[data-run-state="done"]')).to_be_visible(timeout=RUN_TIMEOUT_MS)
    assert page.evaluate("window.notReloaded") is True
    expect(page.locator(UNFINISHED_STATES)).to_have_count(0)


def download_csv(page, section: str) -> tuple[list[dict], list[str]]:
    with page.expect_download() as download:
        page.click(f'[data-csv="{section}"]')
    return csv_rows(Path(download.value.path()))


def test_a_run_whose_job_fails_shows_its_error_in_the_page(
    page, asgi_server, reports_worker, reports_dataset, auditor
):
    """The dataset's folder is a file: the worker's export cannot write there."""
    aside = reports_dataset.with_name("dataset-aside")
    if reports_dataset.exists():
        reports_dataset.rename(aside)
    reports_dataset.write_text("not a folder")
    try:
        log_in(page, asgi_server, AUDITOR)
        page.goto(f"{asgi_server}/reports/reach/?preset=1h")
        page.click("[data-run-report]")
        error = page.locator("[data-run-error]")
        expect(error).to_be_visible(timeout=RUN_TIMEOUT_MS)
        expect(error).to_contain_text("Error")
        expect(page.locator(".error-details summary")).to_have_text("Where it failed")
        expect(page.locator("[data-run-again]")).to_be_visible()
        shot(page, "report-failed")
        assert not ReportRun.objects.filter(state__in=UNFINISHED).exists()
    finally:
        reports_dataset.unlink()
        if aside.exists():
            shutil.move(aside, reports_dataset)
