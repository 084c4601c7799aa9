"""Recording agents' sessions: how many a client has open, since when, and when it was
last seen (broker.models.AgentPresence). The agent socket calls these; the console
reads the rows through broker.reads.presence (`is_connected`, `last_seen_bucket`).

Each function is one statement (an upsert), so concurrent sessions of one client, in
any web process, never lose a count. They are not audited: they observe sessions and
change nothing anyone decided (the login itself is audited when it is refused).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings

from broker.models import AgentPresence
from broker.prepared import prepared_cursor
from broker.push import to_consoles
from broker.reads.presence import presence_window

PEER_LENGTH = AgentPresence._meta.get_field("last_peer").max_length
TABLE = AgentPresence._meta.db_table

# A row not seen within the window only has sessions left open by a web process that
# died: a new session starts the count, and the connection's start, afresh.
OPENED = f"""
INSERT INTO {TABLE} AS p
    (client_id, sessions, connected_since, last_seen_at, last_peer, updated_at)
VALUES (%(client)s, 1, now(), now(), %(peer)s, now())
ON CONFLICT (client_id) DO UPDATE SET
    sessions = CASE WHEN p.last_seen_at < now() - %(window)s THEN 1 ELSE p.sessions + 1 END,
    connected_since = CASE WHEN p.last_seen_at < now() - %(window)s THEN now()
                      ELSE coalesce(p.connected_since, now()) END,
    last_seen_at = now(),
    last_peer = EXCLUDED.last_peer,
    updated_at = now()
"""

CLOSED = f"""
INSERT INTO {TABLE} AS p
    (client_id, sessions, connected_since, last_seen_at, last_peer, updated_at)
VALUES (%(client)s, 0, NULL, now(), '', now())
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
SELECT %(client)s, 1, now(), now(), '', now()
WHERE NOT EXISTS (
    SELECT FROM {TABLE} WHERE client_id = %(client)s AND last_seen_at >= now() - %(refresh)s
)
ON CONFLICT (client_id) DO UPDATE SET
    sessions = greatest(p.sessions, 1),
    connected_since = coalesce(p.connected_since, now()),
    last_seen_at = now(),
    updated_at = now()
WHERE p.last_seen_at < now() - %(refresh)s
"""


def session_opened(*, client_id: int, peer: str) -> None:
    """A session of the client logged in from `peer` (host:port)."""
    _execute(OPENED, client=client_id, peer=peer[:PEER_LENGTH], window=presence_window())
    to_consoles.clients_changed([client_id])


def session_closed(*, client_id: int) -> None:
    """A logged-in session of the client ended; the count never goes below 0."""
    _execute(CLOSED, client=client_id)
    to_consoles.clients_changed([client_id])


def seen(*, client_id: int) -> bool:
    """The client's agent was heard from. Written only when the stored time is older
    than PRESENCE_REFRESH_S; return whether it was."""
    refresh = timedelta(seconds=settings.PRESENCE_REFRESH_S)
    return _execute(SEEN, client=client_id, refresh=refresh) > 0


def _execute(sql: str, **params) -> int:
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
