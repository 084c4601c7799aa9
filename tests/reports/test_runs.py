"""A report's run from request to end: queued once, claimed once, failed with its error
said, never left running when its worker is gone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from broker.audit import Actor
from broker.errors import InvalidInput
from broker.models import AuditEntry
from console.celery import _warm_up_reports
from console.celery import app as celery_app
from reports import runner, services
from reports.models import ReportRun
from reports.results import Params

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

OLIVIA = Actor("user", "olivia")
END = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
# Windows at the calendar's ends: the whole days a job compares with do not fit there.
YEAR_9999 = Params(
    window_start=datetime(9999, 12, 30, tzinfo=UTC), window_end=datetime.max.replace(tzinfo=UTC)
)
YEAR_ONE = Params(
    window_start=datetime.min.replace(tzinfo=UTC), window_end=datetime(1, 1, 2, tzinfo=UTC)
)
DAY = Params(window_start=END - timedelta(days=1), window_end=END)
UNSERVED_QUEUE = "reports-served-by-no-worker"


@pytest.fixture(autouse=True)
def runs_no_worker_takes(settings):
    """These tests play the reports worker themselves: the session's real one (started
    for other modules) must not claim their runs first, so theirs go to a queue it does
    not serve, emptied afterwards."""
    settings.REPORTS_QUEUE = UNSERVED_QUEUE
    yield
    with celery_app.connection_for_write() as connection:
        connection.default_channel.queue_purge(UNSERVED_QUEUE)


def test_the_same_report_asked_twice_is_queued_once_and_audited_once():
    first = services.request_run(kind="reach", params=DAY, actor=OLIVIA)
    second = services.request_run(kind="reach", params=DAY, actor=OLIVIA)
    assert first.pk == second.pk
    assert first.state == ReportRun.State.QUEUED
    assert AuditEntry.objects.filter(action="report.run", outcome="done").count() == 1


@pytest.mark.parametrize(
    ("kind", "params", "field"),
    [
        ("forecast", DAY, "kind"),
        ("reach", Params(window_start=END, window_end=END), "window_end"),
        ("reach", Params(window_start=END.replace(tzinfo=None), window_end=END), "window_start"),
        ("reach", Params(window_start=END - timedelta(days=400), window_end=END), "window_start"),
        ("reach", YEAR_9999, "window_start"),
        ("reach", YEAR_ONE, "window_start"),
        ("reach", Params(window_start=DAY.window_start, window_end=END, region="a\x00b"), "region"),
        ("reach", Params(window_start=DAY.window_start, window_end=END, region=7), "region"),
    ],
)
def test_a_request_that_makes_no_sense_is_refused_naming_its_field(kind, params, field):
    with pytest.raises(InvalidInput) as refusal:
        services.request_run(kind=kind, params=params, actor=OLIVIA)
    assert refusal.value.field == field
    assert not ReportRun.objects.exists()
    assert AuditEntry.objects.filter(action="report.run", outcome="refused").count() == 1


def test_a_run_delivered_twice_is_run_once():
    run = services.request_run(kind="reach", params=DAY, actor=OLIVIA)
    assert services.claim_run(run.pk) is not None
    assert services.claim_run(run.pk) is None  # running elsewhere, heartbeat fresh


def test_a_failing_run_ends_failed_with_its_error_in_words(settings, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the dataset should be")
    settings.REPORTS_DATASET = blocker / "dataset"
    run = services.request_run(kind="reach", params=DAY, actor=OLIVIA)
    runner.run_report(run.pk)
    run.refresh_from_db()
    assert run.state == ReportRun.State.FAILED
    assert run.error.startswith(("NotADirectoryError", "FileExistsError"))
    assert "not-a-folder" in run.error
    assert run.finished_at is not None


def test_a_worker_whose_warm_up_fails_says_so_and_goes_on(monkeypatch, caplog):
    def unreadable():
        raise NotADirectoryError("var/reports/dataset: not a folder")

    monkeypatch.setattr(runner, "warm_up", unreadable)
    _warm_up_reports()  # the worker's start-up thread: it does not raise
    assert "the reports worker's warm-up failed" in caplog.text
    assert "not a folder" in caplog.text


def test_a_run_whose_worker_went_silent_is_failed_by_the_sweep():
    run = services.request_run(kind="reach", params=DAY, actor=OLIVIA)
    services.claim_run(run.pk)
    ReportRun.objects.filter(pk=run.pk).update(
        heartbeat_at=timezone.now() - services.STALLED_AFTER - timedelta(seconds=1)
    )
    assert services.sweep_stalled_runs() == 1
    run.refresh_from_db()
    assert run.state == ReportRun.State.FAILED
    assert "stopped while running" in run.error
    assert services.claim_run(run.pk) is None  # a late redelivery does not revive it


def test_a_run_no_worker_takes_is_failed_saying_so():
    run = services.request_run(kind="reach", params=DAY, actor=OLIVIA)
    ReportRun.objects.filter(pk=run.pk).update(
        created_at=timezone.now() - services.UNCLAIMED_AFTER - timedelta(seconds=1)
    )
    services.sweep_stalled_runs()
    run.refresh_from_db()
    assert run.state == ReportRun.State.FAILED
    assert "No reports worker" in run.error


def test_the_schedule_asks_for_every_report_over_the_last_day():
    runs = services.schedule_reports(now=END)
    assert sorted(r.kind for r in runs) == sorted(ReportRun.Kind.values)
    assert {(r.window_start, r.window_end, r.region) for r in runs} == {
        (DAY.window_start, DAY.window_end, "")
    }
    assert {r.requested_by for r in runs} == {"system:schedule"}
