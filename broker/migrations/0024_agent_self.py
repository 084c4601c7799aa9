from django.db import migrations, models


class Migration(migrations.Migration):
    """What each agent says of itself at login: its software and what it acts on."""

    dependencies = [
        ("broker", "0023_send_templates"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentpresence",
            name="agent_software",
            field=models.CharField(blank=True, db_default="", default="", max_length=64),
        ),
        migrations.AddField(
            model_name="agentpresence",
            name="acts_on",
            field=models.CharField(blank=True, db_default="", default="", max_length=16),
        ),
    ]
