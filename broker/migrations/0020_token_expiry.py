"""Clients' and operators' API tokens expire (CLIENT_TOKEN_DAYS, OPERATOR_TOKEN_DAYS
after they were issued). Tokens issued before get a full lifetime from now."""

from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def give_existing_tokens_a_lifetime(apps, schema_editor):
    now = timezone.now()
    for model, days in (
        ("ClientToken", settings.CLIENT_TOKEN_DAYS),
        ("OperatorToken", settings.OPERATOR_TOKEN_DAYS),
    ):
        tokens = apps.get_model("broker", model).objects.filter(expires_at__isnull=True)
        tokens.update(expires_at=now + timedelta(days=days))


class Migration(migrations.Migration):
    dependencies = [("broker", "0019_models_in_use")]

    operations = [
        migrations.AddField("clienttoken", "expires_at", models.DateTimeField(null=True)),
        migrations.AddField("operatortoken", "expires_at", models.DateTimeField(null=True)),
        migrations.RunPython(give_existing_tokens_a_lifetime, migrations.RunPython.noop),
        migrations.AlterField("clienttoken", "expires_at", models.DateTimeField()),
        migrations.AlterField("operatortoken", "expires_at", models.DateTimeField()),
    ]
