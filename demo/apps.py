from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The worm-response scenario and its synthetic traffic (management commands)."""

    name = "demo"
    verbose_name = "Demo scenario"
