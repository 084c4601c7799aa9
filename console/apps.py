from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operators' console: pages, health checks and the server-time socket."""

    name = "console"
    verbose_name = "Operations console"

    def ready(self) -> None:
        from console import signals  # noqa: F401 - connects the audit receivers
