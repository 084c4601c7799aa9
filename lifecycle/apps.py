from django.apps import AppConfig


class LifecycleConfig(AppConfig):
    """The data's life in PostgreSQL: the tables partitioned by day, retention that
    drops a day once the reports have it, and what a database restored from a backup
    needs before the console may run on it (docs/operations.md)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "lifecycle"
    verbose_name = "Data lifecycle"
