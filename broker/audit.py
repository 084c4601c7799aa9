"""The audit log: every change and every refusal, with actor and reason.

Changes are written in the same transaction as the change, so they stand or fall
together. Refusals are written through the `audit` database alias, a connection of its
own in autocommit mode, so that a refusal is recorded even when the caller's
transaction is rolled back because of it.
"""

from __future__ import annotations

import decimal
import json
import logging
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError
from django.utils import timezone
from django.utils.crypto import salted_hmac

from broker.errors import BrokerError, NotAuthorised
from broker.inputs import printable_text
from broker.models import AuditEntry
from broker.prepared import prepared_cursor, text_array
from policies.explain import admits_sender
from policies.filters import Filter

REFUSALS_DATABASE = "audit"
# What the entries' authentication codes are keyed by: a key derived from SECRET_KEY
# with this salt (Django's salted_hmac), held by the console's hosts, not the database.
MAC_SALT = "sn.audit.entry"
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


# Authentication codes ---------------------------------------------------------------


def authentication_code(
    *,
    at: datetime,
    actor: str,
    action: str,
    target: str,
    outcome: str,
    reason: str,
    details: Any,
    secret: str | None = None,
) -> str:
    """The entry's authentication code: an HMAC (SHA-256) of its fields in canonical
    form, keyed by a key derived from SECRET_KEY (or `secret`). The console's hosts
    hold that key and the database does not: an entry written or edited without it (in
    psql, in a dump) has no code that holds (`manage.py verify_audit`)."""
    fields = [at.astimezone(UTC).isoformat(timespec="microseconds"), actor, action, target,
              outcome, reason]  # fmt: skip
    text = "[" + ",".join(json.dumps(field) for field in fields) + "," + canonical(details) + "]"
    return salted_hmac(MAC_SALT, text, secret=secret, algorithm="sha256").hexdigest()


def entry_code(entry: AuditEntry, *, secret: str | None = None) -> str:
    """`authentication_code` of an entry as stored."""
    return authentication_code(
        at=entry.at, actor=entry.actor, action=entry.action, target=entry.target,
        outcome=entry.outcome, reason=entry.reason, details=entry.details, secret=secret,
    )  # fmt: skip


CHAIN_SALT = "sn.audit.chain"


def chain_code(previous: str, entry_id: int, mac: str, *, secret: str | None = None) -> str:
    """A link's code in the audit chain (auditchain): keyed as the entries' codes are,
    so that nobody without the console's key can make the chain again after removing
    or changing a link."""
    text = f"{previous}|{entry_id}|{mac}"
    return salted_hmac(CHAIN_SALT, text, secret=secret, algorithm="sha256").hexdigest()


START_SALT = "sn.audit.start"


def start_code(position: int, chain: str, *, secret: str | None = None) -> str:
    """The code of the audit chain's start once retention removed its oldest links
    (auditchain): only the console can move it, so a start moved to hide removed links
    does not verify."""
    text = f"{position}|{chain}"
    return salted_hmac(START_SALT, text, secret=secret, algorithm="sha256").hexdigest()


# Numbers are written as their exact decimal value, normalised: PostgreSQL's jsonb keeps
# a number's value, not its spelling (1e16 comes back as 10000000000000000, an integer).
_EXACT = decimal.Context(prec=2000)


def canonical(value: Any) -> str:
    """`value` (JSON data) as one text whatever the order of its keys and the spelling
    of its numbers: the same before it is stored in a jsonb column and after."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int | float):
        number = decimal.Decimal(repr(value) if isinstance(value, float) else value)
        return "0" if number.is_zero() else str(number.normalize(_EXACT))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        items = sorted(((str(key), item) for key, item in value.items()), key=lambda kv: kv[0])
        return "{" + ",".join(f"{json.dumps(k)}:{canonical(v)}" for k, v in items) + "}"
    return "[" + ",".join(canonical(item) for item in value) + "]"


# Writing -------------------------------------------------------------------------------


def record_change(
    *, actor: Actor, action: str, target: str, details: dict | None = None
) -> AuditEntry:
    """Record a change, inside the caller's transaction."""
    entry = AuditEntry(
        at=timezone.now(),
        actor=str(actor),
        action=action,
        target=target,
        outcome=AuditEntry.Outcome.DONE,
        details=_as_stored(details or {}),
    )
    entry.mac = entry_code(entry)
    entry.save(force_insert=True)
    return entry


def _as_stored(details: Any) -> Any:
    """The details as they will read back from the database (keys as text, tuples as
    lists): what the authentication code is computed over."""
    return json.loads(json.dumps(details))


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
INSERT INTO {AuditEntry._meta.db_table}
    (at, actor, action, target, outcome, reason, details, mac)
SELECT %(at)s, i.actor, i.action, i.target, '{AuditEntry.Outcome.DONE}', '', i.details, i.mac
FROM unnest(%(actors)s::text[], %(actions)s::text[], %(targets)s::text[],
            %(details)s::jsonb[], %(macs)s::text[])
    WITH ORDINALITY AS i(actor, action, target, details, mac, n)
ORDER BY i.n
"""


def record_changes(changes: list[Change], *, at: datetime | None = None) -> None:
    """`record_change` for many changes, in one statement (at `at`, else now)."""
    if not changes:
        return
    at = at or timezone.now()
    texts = [json.dumps(change.details) for change in changes]
    codes = [_change_code(at, change, text) for change, text in zip(changes, texts, strict=True)]
    parameters = {
        "at": at,
        "actors": text_array(str(change.actor) for change in changes),
        "actions": text_array(change.action for change in changes),
        "targets": text_array(change.target for change in changes),
        "details": text_array(texts),
        "macs": text_array(codes),
    }
    with prepared_cursor() as cursor:
        cursor.execute(RECORD_CHANGES, parameters)


def _change_code(at: datetime, change: Change, details_text: str) -> str:
    return authentication_code(
        at=at, actor=str(change.actor), action=change.action, target=change.target,
        outcome=AuditEntry.Outcome.DONE, reason="", details=json.loads(details_text),
    )  # fmt: skip


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
    entry.mac = entry_code(entry)
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
