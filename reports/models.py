"""Where the export stands, and the reports' runs and results."""

from __future__ import annotations

from django.db import models


class ExportWatermark(models.Model):
    """How far the Parquet dataset holds one table: every row version written by a
    transaction below `txid` has been exported (docs/reports.md, "Watermarks")."""

    table = models.CharField(max_length=64, unique=True)
    txid = models.BigIntegerField(default=0)
    batches = models.PositiveIntegerField(default=0)
    rows = models.BigIntegerField(default=0)  # row versions exported, in every batch
    exported_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.table} below txid {self.txid}"


class ReportRun(models.Model):
    """One run of a report over a time window (and a region, or all): its progress
    while it runs, then its error or its results (`rows`)."""

    class Kind(models.TextChoices):
        TIMELINE = "timeline", "Incident timeline"
        REACH = "reach", "Reach and containment"
        AUDIT = "audit", "Audit review"
        TREE = "tree", "Tree efficiency"
        LATENCY = "latency", "Delivery latency"

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    region = models.CharField(max_length=128, blank=True)  # "" means every region
    requested_by = models.CharField(max_length=200)  # an audit actor, or "schedule"
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    progress = models.FloatField(default=0.0)  # 0..1
    stage = models.CharField(max_length=200, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Written while it runs: a run whose worker stopped is found by its silence.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The time of the export it read: how fresh its figures are.
    data_as_of = models.DateTimeField(null=True, blank=True)
    export_s = models.FloatField(null=True, blank=True)
    spark_startup_s = models.FloatField(null=True, blank=True)  # 0 when the session was warm
    # Where its job ran: Spark's master (local[*], or a cluster's spark://host:port).
    spark_master = models.CharField(max_length=200, blank=True)
    job_s = models.FloatField(null=True, blank=True)
    summary = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["kind", "-created_at"], name="report_run_newest")]

    def __str__(self) -> str:
        return f"{self.kind} report #{self.pk} ({self.state})"

    @property
    def is_finished(self) -> bool:
        return self.state in (self.State.DONE, self.State.FAILED)


class ReportRow(models.Model):
    """One row of one section of a run's results, in the job's order."""

    run = models.ForeignKey(ReportRun, on_delete=models.CASCADE, related_name="rows")
    section = models.CharField(max_length=32)
    position = models.PositiveIntegerField()
    data = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "section", "position"], name="one_report_row_per_position"
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.section}#{self.position}"
