"""Deliveries lose the single-column indexes Django gives foreign keys: lookups by event
or receiver use an index that starts with it, and none looks up by sender alone.

Only the indexes go: altering the fields the ordinary way would drop and re-add their
foreign keys, which checks every delivery again under a lock."""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = {
    "event": "broker_delivery_event_id_813300ca",
    "receiver": "broker_delivery_receiver_id_421236c8",
    "sender": "broker_delivery_sender_id_afc2e9bd",
}


def field(to: str, related_name: str) -> models.ForeignKey:
    return models.ForeignKey(
        db_index=False,
        on_delete=django.db.models.deletion.CASCADE,
        related_name=related_name,
        to=to,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0016_hops_in_redis_streams"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField("delivery", "event", field("broker.event", "deliveries")),
                migrations.AlterField("delivery", "receiver", field("broker.client", "deliveries")),
                migrations.AlterField("delivery", "sender", field("broker.client", "+")),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{index}"',
                    reverse_sql=f'CREATE INDEX "{index}" ON "broker_delivery" ("{name}_id")',
                )
                for name, index in INDEXES.items()
            ],
        ),
    ]
