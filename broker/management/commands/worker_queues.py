"""Print the Celery queues a tree worker must consume: the default queue (the beat's
tasks) and every dispatcher's, or those of one subtree and the path above it."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from broker.models import Dispatcher
from broker.services.tree import ensure_tree


class Command(BaseCommand):
    help = (
        "Create the default dispatcher tree if needed and print the queues a tree worker "
        "must consume (CELERY_DEFAULT_QUEUE, then the dispatchers'), comma-separated."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--subtree",
            metavar="DISPATCHER",
            help=(
                "only this dispatcher's subtree (e.g. d0.1) and the dispatchers above it, "
                "which every worker of a split tree serves together"
            ),
        )

    def handle(self, *args, subtree: str | None = None, **options):
        ensure_tree()
        dispatchers = list(Dispatcher.objects.order_by("depth", "name"))
        if subtree:
            dispatchers = _subtree_and_path(dispatchers, subtree)
        queues = [dispatcher.queue for dispatcher in dispatchers]
        self.stdout.write(",".join([settings.CELERY_TASK_DEFAULT_QUEUE, *queues]))


def _subtree_and_path(dispatchers: list[Dispatcher], name: str) -> list[Dispatcher]:
    """`name`'s dispatcher, those below it and those above it, in tree order."""
    chosen = next((d for d in dispatchers if d.name == name), None)
    if chosen is None:
        inner = ", ".join(d.name for d in dispatchers if not d.is_leaf) or "none"
        raise CommandError(f"--subtree: there is no dispatcher {name!r} (inner ones: {inner})")
    by_id = {d.pk: d for d in dispatchers}

    def above(dispatcher: Dispatcher) -> list[Dispatcher]:
        path = []
        while dispatcher.parent_id is not None:
            dispatcher = by_id[dispatcher.parent_id]
            path.append(dispatcher)
        return path

    path = {d.pk for d in above(chosen)}
    return [d for d in dispatchers if d.pk == chosen.pk or d.pk in path or chosen in above(d)]
