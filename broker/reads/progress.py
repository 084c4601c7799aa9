"""What became of an event so far, for the console's event page: how many receivers it
targeted, how many have it, answered ok, failed, have not answered, or expired
without ever getting it; overall, per region and per dispatcher.

Everything is counted from the deliveries table in one grouped query, so the page is
as true as the database, and as fast for 25,000 receivers as for 25.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import Count, QuerySet
from django.utils import timezone

from broker.models import ArchivedEvent, Delivery, Event
from broker.reads.deliveries import deliveries_of

State = Delivery.State
NO_REGION = "(no region)"
NO_DISPATCHER = "(none)"
UNANSWERED_STATES = (State.PENDING, State.DELIVERED, State.EXPIRED)
PAGE_SIZE = 50


@dataclass
class Tally:
    """Deliveries of one event by state, for everyone or one region or dispatcher."""

    label: str = ""
    pending: int = 0
    delivered: int = 0  # the agent has it and has not answered
    acked: int = 0
    failed: int = 0
    expired: int = 0

    def add(self, state: str, count: int) -> None:
        setattr(self, state, getattr(self, state) + count)

    @property
    def targeted(self) -> int:
        """Every receiver the event was recorded for."""
        return self.pending + self.delivered + self.acked + self.failed + self.expired

    @property
    def received(self) -> int:
        """Receivers whose agent has it (answered or not)."""
        return self.delivered + self.acked + self.failed

    @property
    def answered(self) -> int:
        return self.acked + self.failed

    @property
    def waiting(self) -> int:
        """No answer yet: recorded or received, not answered, not expired."""
        return self.pending + self.delivered

    @property
    def unanswered(self) -> int:
        """Waiting or expired: those a resend would be sent to (UNANSWERED_STATES)."""
        return self.waiting + self.expired

    def percent(self, part: str) -> float:
        """`part` (a state or property) as a percentage of those targeted."""
        return 100.0 * getattr(self, part) / self.targeted if self.targeted else 0.0


@dataclass
class Progress:
    """An event's deliveries so far: totals, per region and per dispatcher."""

    event: Event
    now: datetime
    total: Tally = field(default_factory=Tally)
    by_region: list[Tally] = field(default_factory=list)
    by_dispatcher: list[Tally] = field(default_factory=list)
    # Counted when retention dropped its deliveries (ArchivedEvent), not now.
    archived: bool = False

    @property
    def live(self) -> bool:
        """Whether the event can still reach receivers (it has not expired)."""
        return self.event.expires_at > self.now

    @property
    def standing(self) -> bool:
        """A live event with a selector: servers that come to match it later get it too."""
        return self.live and bool(self.event.selector)


def state_counts(deliveries: str, *, where: str = "", per_event: bool = False) -> str:
    """The statement counting the deliveries of `deliveries` (a table or a partition,
    quoted) by state, region and dispatcher, as an event's page shows them (and as
    retention keeps them: lifecycle.retention), led by each row's event if `per_event`.
    Its first two parameters label no region and no dispatcher; `where`'s follow."""
    lead, groups = ("d.event_id::text, ", "1, 2, 3, 4") if per_event else ("", "1, 2, 3")
    return f"""
SELECT {lead}d.state,
       COALESCE(region.value #>> '{{}}', %s) AS region,
       COALESCE(dispatcher.name, %s) AS dispatcher,
       count(*)
FROM {deliveries} AS d
JOIN broker_client AS c ON c.id = d.receiver_id
LEFT JOIN broker_dispatcher AS dispatcher ON dispatcher.id = c.dispatcher_id
LEFT JOIN broker_attributevalue AS region
       ON region.client_id = d.receiver_id AND region.name = 'region'
{where}
GROUP BY {groups}
"""


# One event's, from its partition only.
STATE_COUNTS = state_counts("broker_delivery", where="WHERE d.event_id = %s AND d.expires_at = %s")


def event_progress(event: Event) -> Progress:
    """The event's deliveries counted by state, region and dispatcher (one query), or
    as they were counted when retention dropped them."""
    archive = ArchivedEvent.objects.filter(event=event).first()
    if archive is not None:
        progress = progress_of(event, archive.counts)
        progress.archived = True
        return progress
    with connection.cursor() as cursor:
        cursor.execute(STATE_COUNTS, [NO_REGION, NO_DISPATCHER, event.pk, event.expires_at])
        return progress_of(event, cursor.fetchall())


def progress_of(event: Event, counts) -> Progress:
    """The event's progress from its deliveries' counts: (state, region, dispatcher,
    count) rows, as STATE_COUNTS reads them (or an archive kept them)."""
    progress = Progress(event=event, now=timezone.now())
    regions: dict[str, Tally] = {}
    dispatchers: dict[str, Tally] = {}
    for state, region, dispatcher, count in counts:
        progress.total.add(state, count)
        regions.setdefault(region, Tally(region)).add(state, count)
        dispatchers.setdefault(dispatcher, Tally(dispatcher)).add(state, count)
    progress.by_region = sorted(regions.values(), key=lambda tally: tally.label)
    progress.by_dispatcher = sorted(dispatchers.values(), key=lambda tally: tally.label)
    return progress


def unanswered(progress: Progress, *, page: int) -> Page:
    """A page of the receivers of the event that have not answered, by name."""
    rows = (
        deliveries_of(progress.event)
        .filter(state__in=UNANSWERED_STATES)
        .order_by("receiver__name")
        .values("receiver__name", "state", "delivered_at", "received_at")
    )
    return CountedPaginator(rows, PAGE_SIZE, count=progress.total.unanswered).get_page(page)


class CountedPaginator(Paginator):
    """A paginator told how many rows there are: the progress counted them already,
    and counting 25,000 deliveries again would cost the page a second scan."""

    def __init__(self, object_list, per_page: int, *, count: int) -> None:
        super().__init__(object_list, per_page)
        self.known_count = count

    @property
    def count(self) -> int:
        return self.known_count


def failed(event: Event, *, limit: int = PAGE_SIZE) -> list[dict]:
    """The receivers that answered "failed", with the result their agent reported."""
    rows = deliveries_of(event).filter(state=State.FAILED).order_by("receiver__name")
    return list(rows.values("receiver__name", "acked_at", "result")[:limit])


def recent_events(*, sender: str = "", live_only: bool = False) -> QuerySet[Event]:
    """Events with their senders, newest first (of one sender, or still live only);
    `with_counts` adds how their deliveries fared."""
    events = Event.objects.select_related("sender").order_by("-published_at", "-pk")
    if sender:
        events = events.filter(sender__name=sender)
    if live_only:
        events = events.filter(expires_at__gt=timezone.now())
    return events


def with_counts(events: list[Event]) -> list[Event]:
    """`events` with `.tally` set: their deliveries by state, in one query (or as
    retention kept them, and then `.archived`)."""
    tallies = {event.pk: Tally() for event in events}
    counts = (
        Delivery.objects.filter(
            event_id__in=list(tallies),
            expires_at__in={event.expires_at for event in events},  # their partitions only
        )
        .values("event_id", "state")
        .annotate(n=Count("id"))
    )
    for row in counts:
        tallies[row["event_id"]].add(row["state"], row["n"])
    archived = _archived_tallies(list(tallies))
    for event in events:
        event.archived = event.pk in archived
        event.tally = archived.get(event.pk) or tallies[event.pk]
    return events


def _archived_tallies(event_ids: list) -> dict:
    """{event id: its tally as retention kept it} for those of `event_ids` archived."""
    kept = ArchivedEvent.objects.filter(event__in=event_ids).values_list("event_id", "counts")
    return {event_id: tally_of(counts) for event_id, counts in kept}


def tally_of(counts) -> Tally:
    """The total of (state, region, dispatcher, count) rows, as STATE_COUNTS reads them."""
    tally = Tally()
    for state, _, _, count in counts:
        tally.add(state, count)
    return tally
