"""What retention keeps of what it drops (lifecycle.retention)."""

from __future__ import annotations

from django.db import models


class DroppedDay(models.Model):
    """A day's partition of a table that retention dropped: when, how many rows it
    held, and the export watermark that had covered every one of them."""

    table = models.CharField(max_length=64)
    day = models.DateField()
    rows = models.BigIntegerField()
    watermark = models.BigIntegerField(null=True)  # None: a table the reports do not export
    dropped_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["table", "day"], name="dropped_once")]
        ordering = ["-dropped_at"]

    def __str__(self) -> str:
        return f"{self.table} of {self.day} dropped"
