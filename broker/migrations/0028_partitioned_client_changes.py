"""The clients' change log partitioned by day (docs/operations.md, "Partitions"): the
leaves and the console's directory read only its newest changes, so retention keeps
`ClientChange.KEPT_DAYS` days of it and drops the rest whole. Only those days are
copied: older changes were read long ago, and a reader idle for longer builds what it
holds anew (ClientChange.STALE_AFTER_S)."""

from django.db import migrations

from broker.migrations._partitioning import partition_by_day


def partition(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        partition_by_day(
            cursor, table="broker_clientchange", key="at", keep="t.at > now() - interval '2 days'"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0027_archived_event"),
    ]

    operations = [migrations.RunPython(partition, elidable=False)]
