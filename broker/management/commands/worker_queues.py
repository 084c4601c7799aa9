"""Print the Celery queues a worker must consume: the default queue (the beat's tasks)
and every dispatcher's."""

from django.conf import settings
from django.core.management.base import BaseCommand

from broker.models import Dispatcher
from broker.services.tree import ensure_tree


class Command(BaseCommand):
    help = (
        "Create the default dispatcher tree if needed and print the queues a worker must "
        "consume (CELERY_DEFAULT_QUEUE, then every dispatcher's), comma-separated."
    )

    def handle(self, *args, **options):
        ensure_tree()
        queues = [d.queue for d in Dispatcher.objects.order_by("depth", "name")]
        self.stdout.write(",".join([settings.CELERY_TASK_DEFAULT_QUEUE, *queues]))
