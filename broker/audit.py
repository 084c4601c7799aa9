"""The audit log: every change and every refusal, with actor and reason.

Changes are written in the same transaction as the change, so they stand or fall
together. Refusals are written through the `audit` database alias, a connection of its
own in autocommit mode, so that a refusal is recorded even when the caller's
transaction is rolled back because of it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from broker.errors import BrokerError, NotAuthorised
from broker.inputs import printable_text
from broker.models import AuditEntry
from broker.prepared import prepared_cursor, text_array
from policies.explain import admits_sender
from policies.filters import Filter

REFUSALS_DATABASE = "audit"
SHORT_TEXT = 200  # the actor and target columns
LONG_TEXT = 20_000  # a policy's text fits
MAX_DETAIL_DEPTH = 8
MAX_LISTED_NAMES = 1000  # names an entry about many clients lists; the rest are counted

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Actor:
    """Who acts: an operator (`user`), a client, an authority or the system."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


SYSTEM = Actor("system", "broker")

# What kind of refusal an entry records, in its details["category"] (docs/reports.md).
# A receiver's policy refuses the sender's attested attributes, whatever the content:
SENDER_NOT_QUALIFIED = "sender_not_qualified"
# A receiver's policy admits the sender, but its clauses on the content refuse:
CONTENT_FILTERED = "content_filtered"
# A client stating, or an authority attesting, an attribute it may not (a sender's
# attributes forged inside an event's content included):
ATTRIBUTE_NOT_AUTHORISED = "attribute_not_authorised"
# An operator lacking the role or permission, or a client lacking the sender's role:
ROLE_REFUSED = "role_refused"
OTHER = "other"  # invalid input, failed logins, unknown objects...
REFUSAL_CATEGORIES = (
    SENDER_NOT_QUALIFIED,
    CONTENT_FILTERED,
    ATTRIBUTE_NOT_AUTHORISED,
    ROLE_REFUSED,
    OTHER,
)


def record_change(
    *, actor: Actor, action: str, target: str, details: dict | None = None
) -> AuditEntry:
    """Record a change, inside the caller's transaction."""
    return AuditEntry.objects.create(
        at=timezone.now(),
        actor=str(actor),
        action=action,
        target=target,
        outcome=AuditEntry.Outcome.DONE,
        details=details or {},
    )


@dataclass(frozen=True)
class Change:
    """One change to record (`record_changes`)."""

    actor: Actor
    action: str
    target: str
    details: dict


# Many changes' entries in one statement, in their order. Built by hand, not with
# bulk_create: an agents' load reports are a change each, and the ORM's per-object work
# was a tenth of an idle web process.
RECORD_CHANGES = f"""
INSERT INTO {AuditEntry._meta.db_table} (at, actor, action, target, outcome, reason, details)
SELECT %(at)s, i.actor, i.action, i.target, '{AuditEntry.Outcome.DONE}', '', i.details
FROM unnest(%(actors)s::text[], %(actions)s::text[], %(targets)s::text[],
            %(details)s::jsonb[]) WITH ORDINALITY AS i(actor, action, target, details, n)
ORDER BY i.n
"""


def record_changes(changes: list[Change]) -> None:
    """`record_change` for many changes, in one statement."""
    if not changes:
        return
    parameters = {
        "at": timezone.now(),
        "actors": text_array(str(change.actor) for change in changes),
        "actions": text_array(change.action for change in changes),
        "targets": text_array(change.target for change in changes),
        "details": text_array(json.dumps(change.details) for change in changes),
    }
    with prepared_cursor() as cursor:
        cursor.execute(RECORD_CHANGES, parameters)


def listed(names: list[str], *, total: int | None = None) -> dict:
    """Names for an entry's details: the first MAX_LISTED_NAMES, and how many more
    (of `total`, when only some of the names were read)."""
    shown = names[:MAX_LISTED_NAMES]
    return {
        "names": shown,
        "unlisted": max(0, (len(names) if total is None else total) - len(shown)),
    }


@contextmanager
def refusals_recorded(
    *, actor: Actor, action: str, target: str, details: dict | None = None
) -> Iterator[None]:
    """Check inputs inside this block: a BrokerError raised there is audited as a
    refusal (with the offending field) and raised again."""
    try:
        yield
    except BrokerError as error:
        record_error(error, actor=actor, action=action, target=target, details=details)
        raise


def record_error(
    error: BrokerError, *, actor: Actor, action: str, target: str, details: dict | None = None
) -> None:
    """Record `error` as the refusal of `action` (with the offending field), as
    `refusals_recorded` does for an error raised in its block: for a caller that
    answers many requests at once and refuses some of them without raising."""
    record_refusal(
        actor=actor,
        action=action,
        target=target,
        reason=error.message,
        details={**(details or {}), "field": error.field},
        error=error,
    )


def refusal_category(*, action: str, error: BrokerError | None = None) -> str:
    """The kind of a refusal of `action` that raised `error` (None: refused without an
    error, e.g. a trust plan's refused clients). The one place that decides it; a
    caller that knows better (a console 403, a policy at a leaf) says so itself."""
    authorisation = error is None or isinstance(error, NotAuthorised)
    if action.startswith("attributes.") and authorisation:
        return ATTRIBUTE_NOT_AUTHORISED
    if not isinstance(error, NotAuthorised):
        return OTHER
    if (error.field or "").startswith("content."):
        return ATTRIBUTE_NOT_AUTHORISED  # sender attributes forged inside the event
    if error.field == "sender":
        # An operator who may not send as this sender, or a client that is no sender.
        return ROLE_REFUSED
    return OTHER


def policy_refusal_category(filters: list[Filter], sender: Mapping[str, Any]) -> str:
    """Why a policy (its filters) refused an event: the sender (no branch admits its
    attested attributes, whatever the content) or the content (some branch admits the
    sender; its clauses on the content refuse)."""
    return CONTENT_FILTERED if admits_sender(filters, sender) else SENDER_NOT_QUALIFIED


def record_refusal(
    *,
    actor: Actor,
    action: str,
    target: str,
    reason: str,
    details: dict | None = None,
    error: BrokerError | None = None,
) -> AuditEntry | None:
    """Record a refusal on its own connection, so that no rollback can lose it.

    Its kind is `details["category"]` when the caller says it, else what
    `refusal_category` makes of the action and the `error` that refused it.

    What the refused party sent is cleaned first (NUL, lone surrogates, NaN, oversized
    text), so that no input can make the record fail. If the database fails anyway,
    the refusal still stands: it is logged as an error, with everything the entry would
    have held, and None is returned.
    """
    category = refusal_category(action=action, error=error)
    entry = AuditEntry(
        at=timezone.now(),
        actor=printable_text(str(actor), SHORT_TEXT),
        action=action,
        target=printable_text(target, SHORT_TEXT),
        outcome=AuditEntry.Outcome.REFUSED,
        reason=printable_text(reason, LONG_TEXT),
        details=storable({"category": category, **(details or {})}),
    )
    try:
        entry.save(using=REFUSALS_DATABASE)
    except DatabaseError:
        logger.exception(
            "AUDIT ENTRY LOST: could not record the refusal of %s by %s on %s: %s %s",
            entry.action, entry.actor, entry.target, entry.reason, entry.details,
        )  # fmt: skip
        return None
    return entry


def storable(value: Any, depth: int = 0) -> Any:
    """`value` as an audit entry's JSON can hold it: text cleaned and cut, numbers
    finite, anything else spelled out with repr()."""
    if isinstance(value, str):
        return printable_text(value, LONG_TEXT)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth < MAX_DETAIL_DEPTH and isinstance(value, Mapping):
        return {
            printable_text(str(key), SHORT_TEXT): storable(item, depth + 1)
            for key, item in value.items()
        }
    if depth < MAX_DETAIL_DEPTH and isinstance(value, list | tuple):
        return [storable(item, depth + 1) for item in value]
    return printable_text(repr(value), LONG_TEXT)
