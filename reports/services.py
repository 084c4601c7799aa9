"""Starting reports, and what becomes of a run: its progress, its results, its error.

A run is requested by an operator (or the schedule), then run by the reports worker
(reports.tasks), which exports what changed, runs the job on Spark and stores its rows.
Whatever happens, a run ends `done` or `failed`: a job's error is stored with the run,
and a run whose worker stopped is found by its silent heartbeat (sweep_stalled_runs).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from broker import audit
from broker.audit import Actor
from broker.errors import InvalidInput
from broker.push import to_consoles
from reports.jobs import KINDS
from reports.models import ReportRow, ReportRun
from reports.results import Params, Result

logger = logging.getLogger(__name__)

MAX_WINDOW = timedelta(days=366)
# The moments a window may hold: the jobs compare with whole days around its ends,
# which the far ends of the calendar (year 1, 9999) have no room for.
EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)
ENDS = {"window_start": "start (from)", "window_end": "end (to)"}  # as the page names them
MAX_REGION_CHARS = 128
ROWS_PER_INSERT = 2000
# A running report writes its heartbeat every second or so; one silent this long lost
# its worker (killed, or its machine gone).
STALLED_AFTER = timedelta(seconds=60)
# A queued report waits behind others on the one reports worker; one still queued
# after this long has no worker to run it.
UNCLAIMED_AFTER = timedelta(minutes=30)
SCHEDULE = Actor("system", "schedule")

# The Celery task that runs a report (reports.tasks.run_report).
RUN_TASK = "reports.run"


def request_run(*, kind: str, params: Params, actor: Actor) -> ReportRun:
    """Queue a run of report `kind` over `params`, or return the identical one already
    queued or running. Audited; the worker is asked after commit."""
    details = {"kind": kind, **_described(params)}
    with audit.refusals_recorded(actor=actor, action="report.run", target="reports"):
        check_request(kind=kind, params=params)
        with transaction.atomic():
            run = _unfinished_twin(kind, params)
            if run is not None:
                return run
            run = ReportRun.objects.create(
                kind=kind,
                window_start=params.window_start,
                window_end=params.window_end,
                region=params.region,
                requested_by=str(actor),
            )
            audit.record_change(
                actor=actor, action="report.run", target=f"report:{run.pk}", details=details
            )
            transaction.on_commit(lambda: _enqueue(run.pk), robust=True)
    return run


def check_request(*, kind: str, params: Params) -> None:
    """Refuse a report that does not exist or a window that makes no sense, naming the
    field."""
    if kind not in KINDS:
        raise InvalidInput(f"no report {kind!r}; reports are {', '.join(KINDS)}", field="kind")
    for name in ("window_start", "window_end"):
        value = getattr(params, name)
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise InvalidInput(f"{name} must be a date and time with a time zone", field=name)
        if not EARLIEST <= value <= LATEST:
            bounds = f"between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d} (UTC)"
            raise InvalidInput(f"the window's {ENDS[name]} must lie {bounds}", field=name)
    if params.window_end <= params.window_start:
        raise InvalidInput("the window must end after it starts", field="window_end")
    if params.window_end - params.window_start > MAX_WINDOW:
        raise InvalidInput("the window may span at most 366 days", field="window_start")
    region = params.region
    if not isinstance(region, str) or len(region) > MAX_REGION_CHARS or not region.isprintable():
        raise InvalidInput(
            f"region must be printable text of at most {MAX_REGION_CHARS} characters",
            field="region",
        )


def _described(params: Params) -> dict:
    return {
        "window_start": _iso(params.window_start),
        "window_end": _iso(params.window_end),
        "region": params.region if isinstance(params.region, str) else repr(params.region),
    }


def _iso(value) -> str:
    return value.isoformat() if isinstance(value, datetime) else repr(value)


def _unfinished_twin(kind: str, params: Params) -> ReportRun | None:
    return (
        ReportRun.objects.filter(
            kind=kind,
            window_start=params.window_start,
            window_end=params.window_end,
            region=params.region,
            state__in=(ReportRun.State.QUEUED, ReportRun.State.RUNNING),
        )
        .order_by("-created_at")
        .first()
    )


def _enqueue(run_id: int) -> None:
    # By name: the task's module (reports.tasks) builds on this one.
    current_app.send_task(RUN_TASK, (run_id,), queue=settings.REPORTS_QUEUE)
    to_consoles.report_changed(run_id)


def record_export(*, actor: Actor, run: ReportRun, section: str, file_format: str = "csv") -> None:
    """Record that `actor` took a section of a run's results away (audited like the
    audit log's own exports)."""
    audit.record_change(
        actor=actor,
        action="report.export",
        target=f"report:{run.pk}",
        details={"kind": run.kind, "section": section, "format": file_format,
                 **_described(params_of(run))},
    )  # fmt: skip


def params_of(run: ReportRun) -> Params:
    """What `run` covers."""
    return Params(window_start=run.window_start, window_end=run.window_end, region=run.region)


def claim_run(run_id: int) -> ReportRun | None:
    """Mark the run as running here, unless it is finished or another worker runs it
    (its heartbeat is fresh): a task delivered twice runs the report once."""
    now = timezone.now()
    with transaction.atomic():
        run = ReportRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.is_finished:
            return None
        if run.state == ReportRun.State.RUNNING and now - run.heartbeat_at < STALLED_AFTER:
            return None
        run.state = ReportRun.State.RUNNING
        run.started_at = run.heartbeat_at = now
        run.stage, run.progress = "starting", 0.0
        run.save(update_fields=["state", "started_at", "heartbeat_at", "stage", "progress"])
    to_consoles.report_changed(run_id)
    return run


def record_progress(*, run_id: int, stage: str, fraction: float) -> None:
    """A running report's stage in words and how far it is (0..1); also its heartbeat."""
    updated = ReportRun.objects.filter(pk=run_id, state=ReportRun.State.RUNNING).update(
        stage=stage[:200], progress=min(max(fraction, 0.0), 1.0), heartbeat_at=timezone.now()
    )
    if updated:
        to_consoles.report_changed(run_id)


def store_result(
    *,
    run_id: int,
    result: Result,
    data_as_of: datetime,
    timings: dict[str, float],
    spark_master: str = "",
) -> None:
    """The job's rows and figures, where it ran, and the run done, all at once."""
    rows = [
        ReportRow(run_id=run_id, section=section, position=position, data=data)
        for section, section_rows in result.sections.items()
        for position, data in enumerate(section_rows)
    ]
    with transaction.atomic():
        ReportRow.objects.filter(run_id=run_id).delete()
        ReportRow.objects.bulk_create(rows, batch_size=ROWS_PER_INSERT)
        ReportRun.objects.filter(pk=run_id).update(
            state=ReportRun.State.DONE,
            progress=1.0,
            stage="done",
            summary=result.summary,
            data_as_of=data_as_of,
            finished_at=timezone.now(),
            export_s=timings.get("export"),
            spark_startup_s=timings.get("startup"),
            job_s=timings.get("job"),
            spark_master=spark_master,
        )
    to_consoles.report_changed(run_id)


def fail_run(*, run_id: int, error: str) -> None:
    """The run ended without results; `error` says why, in words for the page."""
    ReportRun.objects.filter(pk=run_id).exclude(state=ReportRun.State.DONE).update(
        state=ReportRun.State.FAILED, error=error[:20_000], finished_at=timezone.now()
    )
    to_consoles.report_changed(run_id)


def sweep_stalled_runs() -> int:
    """Fail the runs whose worker went silent, and those no worker ever took; return
    how many. Periodic (the beat)."""
    now = timezone.now()
    stalled = ReportRun.objects.filter(
        state=ReportRun.State.RUNNING, heartbeat_at__lt=now - STALLED_AFTER
    )
    unclaimed = ReportRun.objects.filter(
        state=ReportRun.State.QUEUED, created_at__lt=now - UNCLAIMED_AFTER
    )
    ended = _fail_all(
        stalled, "The reports worker stopped while running this report (killed or lost). "
    )
    ended += _fail_all(
        unclaimed, "No reports worker took this report in 30 minutes: is one running? "
    )
    return ended


def _fail_all(runs, why: str) -> int:
    ids = list(runs.values_list("pk", flat=True))
    for run_id in ids:
        fail_run(run_id=run_id, error=why + "Start it again.")
    return len(ids)


def schedule_reports(*, now: datetime | None = None) -> list[ReportRun]:
    """Every report over the last day, for every region (periodic: the beat)."""
    end = (now or timezone.now()).replace(microsecond=0)
    params = Params(window_start=end - timedelta(days=1), window_end=end)
    return [request_run(kind=kind, params=params, actor=SCHEDULE) for kind in KINDS]
