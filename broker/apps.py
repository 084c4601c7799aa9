from django.apps import AppConfig


class BrokerConfig(AppConfig):
    """The Selective Notification event service."""

    name = "broker"
    verbose_name = "Event service"
