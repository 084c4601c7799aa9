"""Summaries keep their last versions (SummaryVersion) instead of only the one before:
a parent resending what a child's growth may concern needs the version before the one
that grew, and a burst of changes stores many versions before the parent looks.

The summaries stored now and the ones they replaced are kept as their first versions."""

import django.db.models.deletion
from django.db import migrations, models


def keep_stored_versions(apps, schema_editor):
    DispatcherSummary = apps.get_model("broker", "DispatcherSummary")
    SummaryVersion = apps.get_model("broker", "SummaryVersion")
    kept = []
    for row in DispatcherSummary.objects.filter(version__gt=0):
        kept.append(SummaryVersion(dispatcher_id=row.pk, version=row.version, data=row.data))
        if row.previous_data is not None and row.version > 1:
            kept.append(
                SummaryVersion(dispatcher_id=row.pk, version=row.version - 1, data=row.previous_data)
            )
    SummaryVersion.objects.bulk_create(kept)


def restore_previous_data(apps, schema_editor):
    DispatcherSummary = apps.get_model("broker", "DispatcherSummary")
    SummaryVersion = apps.get_model("broker", "SummaryVersion")
    for row in DispatcherSummary.objects.filter(version__gt=1):
        before = SummaryVersion.objects.filter(dispatcher_id=row.pk, version=row.version - 1)
        row.previous_data = before.values_list("data", flat=True).first()
        row.save(update_fields=["previous_data"])


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0017_delivery_indexes_by_prefix"),
    ]

    operations = [
        migrations.CreateModel(
            name="SummaryVersion",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("version", models.PositiveBigIntegerField()),
                ("data", models.JSONField()),
                (
                    "dispatcher",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="summary_versions",
                        to="broker.dispatcher",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("dispatcher", "version"), name="summary_version_once_per_dispatcher"
                    )
                ],
            },
        ),
        migrations.RunPython(keep_stored_versions, restore_previous_data),
        migrations.RemoveField(model_name="dispatchersummary", name="previous_data"),
    ]
