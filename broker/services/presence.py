"""Recording agents' sessions: how many a client has open, since when, and when it was
last seen (broker.models.AgentPresence). The agent socket calls these; the console
reads the rows through broker.reads.presence (`is_connected`, `last_seen_bucket`).

Each kind of change is one statement (an upsert) for all the clients of a batch, so
concurrent sessions of one client, in any web process, never lose a count; a web
process records its sessions' changes together (broker.consumers). They are not
audited: they observe sessions and change nothing anyone decided (the login itself is
audited when it is refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from django.conf import settings
from django.db import transaction

from broker.models import AgentPresence
from broker.prepared import int_array, prepared_cursor, text_array
from broker.protocol import UNKNOWN_AGENT, AgentSelf
from broker.push import to_consoles
from broker.reads.presence import presence_window

PEER_LENGTH = AgentPresence._meta.get_field("last_peer").max_length
TABLE = AgentPresence._meta.db_table

# A row not seen within the window only has sessions left open by a web process that
# died: a new session starts the count, and the connection's start, afresh. Rows are
# written in client order, whatever the order of the batch: two web processes' batches
# never wait for each other's rows crosswise.
OPENED = f"""
INSERT INTO {TABLE} AS p
    (client_id, sessions, connected_since, last_seen_at, last_peer, agent_software, acts_on,
     updated_at)
SELECT i.client, 1, now(), now(), i.peer, i.software, i.acts_on, now()
FROM unnest(%(clients)s::bigint[], %(peers)s::text[], %(software)s::text[],
            %(acts_on)s::text[]) AS i(client, peer, software, acts_on)
ORDER BY i.client
ON CONFLICT (client_id) DO UPDATE SET
    sessions = CASE WHEN p.last_seen_at < now() - %(window)s THEN 1 ELSE p.sessions + 1 END,
    connected_since = CASE WHEN p.last_seen_at < now() - %(window)s THEN now()
                      ELSE coalesce(p.connected_since, now()) END,
    last_seen_at = now(),
    last_peer = EXCLUDED.last_peer,
    agent_software = EXCLUDED.agent_software,
    acts_on = EXCLUDED.acts_on,
    updated_at = now()
"""

CLOSED = f"""
INSERT INTO {TABLE} AS p
    (client_id, sessions, connected_since, last_seen_at, last_peer, updated_at)
SELECT i.client, 0, NULL, now(), '', now()
FROM unnest(%(clients)s::bigint[]) AS i(client)
ORDER BY i.client
ON CONFLICT (client_id) DO UPDATE SET
    sessions = greatest(p.sessions - 1, 0),
    connected_since = CASE WHEN p.sessions > 1 THEN p.connected_since END,
    last_seen_at = now(),
    updated_at = now()
"""

# A session that is seen is open: at least one session, whatever was (not) recorded
# when it opened. A fresh row is left alone without even a row lock (NOT EXISTS).
SEEN = f"""
INSERT INTO {TABLE} AS p
    (client_id, sessions, connected_since, last_seen_at, last_peer, updated_at)
SELECT i.client, 1, now(), now(), '', now()
FROM unnest(%(clients)s::bigint[]) AS i(client)
WHERE NOT EXISTS (
    SELECT FROM {TABLE} WHERE client_id = i.client AND last_seen_at >= now() - %(refresh)s
)
ORDER BY i.client
ON CONFLICT (client_id) DO UPDATE SET
    sessions = greatest(p.sessions, 1),
    connected_since = coalesce(p.connected_since, now()),
    last_seen_at = now(),
    updated_at = now()
WHERE p.last_seen_at < now() - %(refresh)s
RETURNING p.client_id
"""


class Kind(StrEnum):
    """What happened to a session."""

    OPENED = "opened"
    CLOSED = "closed"
    SEEN = "seen"


@dataclass(frozen=True)
class PresenceChange:
    """What a session tells of its client: it opened (logged in from `peer`, host:port,
    its agent saying what it is and acts on), closed, or was heard from."""

    client_id: int
    kind: Kind
    peer: str = ""
    agent: AgentSelf = UNKNOWN_AGENT


def record(changes: list[PresenceChange]) -> list[bool]:
    """Record sessions' changes, at most one per client (web processes group them: a
    fleet's heartbeats and logins); a statement per kind present. Returns, per change,
    whether it wrote: a `seen` is written only when the stored time is older than
    PRESENCE_REFRESH_S, the others always."""
    if len({change.client_id for change in changes}) != len(changes):
        raise ValueError("at most one change per client in one call")
    by_kind = {kind: [c for c in changes if c.kind == kind] for kind in Kind}
    refresh = timedelta(seconds=settings.PRESENCE_REFRESH_S)
    opened = by_kind[Kind.OPENED]
    peers = text_array(change.peer[:PEER_LENGTH] for change in opened)
    software = text_array(change.agent.software for change in opened)
    acts_on = text_array(change.agent.acts_on for change in opened)
    # All or nothing: a batch that fails is run again change by change, and a session
    # counted twice would look connected for ever.
    with transaction.atomic():
        written = {row[0] for row in _run(SEEN, by_kind[Kind.SEEN], refresh=refresh)}
        _run(OPENED, opened, peers=peers, software=software, acts_on=acts_on,
             window=presence_window())  # fmt: skip
        _run(CLOSED, by_kind[Kind.CLOSED])
    opened_or_closed = [c.client_id for c in changes if c.kind != Kind.SEEN]
    if opened_or_closed:
        to_consoles.clients_changed(opened_or_closed)
    return [change.kind != Kind.SEEN or change.client_id in written for change in changes]


def session_opened(*, client_id: int, peer: str, agent: AgentSelf = UNKNOWN_AGENT) -> None:
    """A session of the client logged in from `peer` (host:port); its agent says
    what it is and what it acts on (`agent`)."""
    record([PresenceChange(client_id, Kind.OPENED, peer, agent)])


def session_closed(*, client_id: int) -> None:
    """A logged-in session of the client ended; the count never goes below 0."""
    record([PresenceChange(client_id, Kind.CLOSED)])


def seen(*, client_id: int) -> bool:
    """The client's agent was heard from; return whether that was written."""
    return record([PresenceChange(client_id, Kind.SEEN)])[0]


def _run(sql: str, changes: list[PresenceChange], **params) -> list[tuple]:
    """Run `sql` for the clients of `changes`, if any; the rows it returns."""
    if not changes:
        return []
    clients = int_array(change.client_id for change in changes)
    with prepared_cursor() as cursor:
        cursor.execute(sql, {"clients": clients, **params})
        return cursor.fetchall() if cursor.description else []
