"""Entry points into the dispatcher tree for the rest of the app."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from broker.dispatch.routing import UP, RouteHop
from broker.models import Event

STALLED_AFTER = timedelta(seconds=30)


def enqueue_event(event_id) -> None:
    """Start routing a committed event at its sender's leaf."""
    from broker.tasks import enqueue_hops

    event = (
        Event.objects.select_related("sender").only("id", "sender__dispatcher_id").get(pk=event_id)
    )
    enqueue_hops([RouteHop(event.sender.dispatcher_id, [str(event.pk)], UP)])


def reroute_stalled_events(*, older_than: timedelta = STALLED_AFTER) -> int:
    """Route again live events that never reached the root (a lost enqueue, say).
    Deliveries are idempotent, so routing an event twice delivers it once."""
    now = timezone.now()
    stalled = Event.objects.filter(
        routed_at__isnull=True, published_at__lt=now - older_than, expires_at__gt=now
    ).values_list("pk", flat=True)[:1000]
    for event_id in stalled:
        enqueue_event(event_id)
    return len(stalled)
