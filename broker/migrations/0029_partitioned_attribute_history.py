"""The attribute history partitioned by day (docs/operations.md, "Partitions"), so that
retention can drop its old days whole. A row carried forward by retention says where it
came from (`carried_from`): the values standing when a day is dropped are copied into
the first day kept, so reads "as of" a moment from then on find them."""

from django.db import migrations, models

from broker.migrations._partitioning import partition_by_day


def partition(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        partition_by_day(cursor, table="broker_attributehistory", key="at")


class Migration(migrations.Migration):
    dependencies = [
        ("broker", "0028_partitioned_client_changes"),
    ]

    operations = [
        migrations.AddField(
            model_name="attributehistory",
            name="carried_from",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(partition, elidable=False),
        migrations.AddIndex(
            model_name="attributehistory",
            index=models.Index(
                condition=models.Q(("carried_from__isnull", False)),
                fields=["at"],
                name="attribute_carried",
            ),
        ),
    ]
