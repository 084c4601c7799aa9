"""Print the Celery queues a worker must consume to serve the dispatcher tree."""

from django.core.management.base import BaseCommand

from broker.models import Dispatcher
from broker.services.tree import ensure_tree


class Command(BaseCommand):
    help = "Create the default dispatcher tree if needed and print its queues, comma-separated."

    def handle(self, *args, **options):
        ensure_tree()
        queues = [d.queue for d in Dispatcher.objects.order_by("depth", "name")]
        self.stdout.write(",".join(queues))
