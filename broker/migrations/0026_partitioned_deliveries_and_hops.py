"""Deliveries and traffic records partitioned by day (docs/operations.md, "Partitions"):
a day of them is dropped whole once it is past retention and exported, instead of
deleted row by row.

Deliveries by their event's expiry, copied onto each delivery (`expires_at`): every
delivery of an event is in one partition (so "one delivery per receiver" stays unique
across partitions), the deliveries of live events are in the few partitions from today
on (what the leaves, confirmations and replays read), and a partition past retention
holds no live event. Traffic records by when the hop happened (`at`).
"""

from django.db import migrations, models

from broker.migrations._partitioning import partition_by_day


def partition(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        partition_by_day(
            cursor,
            table="broker_delivery",
            key="expires_at",
            key_column="timestamp with time zone NOT NULL",
            key_from="(SELECT e.expires_at FROM broker_event e WHERE e.id = t.event_id)",
        )
        partition_by_day(cursor, table="broker_trafficrecord", key="at")


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0025_audit_entry_mac"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(partition, elidable=False)],
            state_operations=[
                migrations.AddField(
                    model_name="delivery",
                    name="expires_at",
                    field=models.DateTimeField(),
                    preserve_default=False,
                ),
                migrations.RemoveConstraint(model_name="delivery", name="one_delivery_per_receiver"),
                migrations.RemoveConstraint(model_name="delivery", name="one_delivery_per_position"),
                migrations.AddConstraint(
                    model_name="delivery",
                    constraint=models.UniqueConstraint(
                        fields=("event", "receiver", "expires_at"), name="one_delivery_per_receiver"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="delivery",
                    constraint=models.UniqueConstraint(
                        fields=("receiver", "position", "expires_at"),
                        name="one_delivery_per_position",
                    ),
                ),
            ],
        ),
    ]
