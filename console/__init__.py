"""The Django project: settings, URLs, ASGI and Celery apps, and the operators' pages."""

from console.celery import app as celery_app

__all__ = ["celery_app"]
