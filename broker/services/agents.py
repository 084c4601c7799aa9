"""What a connected agent may do, in the agent protocol's terms (docs/protocol.md).

Each function takes the client the connection authenticated as: an agent acts only as
itself. The rules themselves live in the other services; this module adds what is
particular to a session (its login, a complete advertisement, compact answers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker import audit, protocol
from broker.audit import Actor
from broker.errors import AuthenticationFailed, BrokerError, InvalidInput
from broker.models import Client
from broker.reads.clients import OwnAttributes, own_attributes_of
from broker.reads.deliveries import (
    deliveries_to_replay,
    last_positions_of,
    position_after_delivery,
)
from broker.services.clients import (
    StatedValues,
    authenticate_clients,
    state_attributes_of_clients,
    token_refused,
)
from broker.services.deliveries import AheadOfStream, catch_streams_up
from broker.services.events import SenderSignature, publish_event
from broker.services.policies import set_policy


@dataclass(frozen=True)
class Login:
    """A session's login: its token, its peer (host:port), where its agent asks the
    replay to start (a position, or, as the protocol's first revision did, a delivery
    id), and `joining`: given the client's id once the token is accepted, the session
    notes the group of that client's live pushes and returns (group, its channel)."""

    token: str
    peer: str
    after_position: int | None
    after_delivery: int | None
    joining: Callable[[int], tuple[str, str]]


@dataclass(frozen=True)
class OpenedSession:
    """What a login needs to answer: the client, the end of its stream when the
    session joined its live pushes, where the replay starts, and its first page."""

    client: Client
    last_position: int
    after_position: int | None
    first_page: list[dict]


# Joins sessions to their clients' live pushes: [(group, session channel)].
Join = Callable[[list[tuple[str, str]]], None]


def start_sessions(logins: list[Login], *, join: Join) -> list[OpenedSession | BrokerError]:
    """Many sessions' logins at once (a fleet logging in; broker.group_commit): for
    each, in order, its opened session or its (audited) refusal. The tokens are checked
    in one statement, the sessions `join`ed in one call, then the streams' ends read in
    one statement: joining comes before the reads, so that nothing falls between the
    replay and the live pushes (a push crossing the replay comes twice; the agent drops
    the repeat)."""
    clients = authenticate_clients([login.token for login in logins])
    paired = list(zip(logins, clients, strict=True))
    admitted = [(login, client) for login, client in paired if client]
    if admitted:
        join([login.joining(client.pk) for login, client in admitted])
    ends = last_positions_of([client for _, client in admitted])
    ends.update(_caught_up(admitted, ends))
    return [
        _opened(login, client, ends[client.pk]) if client else _refused_login(login)
        for login, client in paired
    ]


def _caught_up(admitted: list[tuple[Login, Client]], ends: dict[int, int]) -> dict[int, int]:
    """The streams of agents that hold positions beyond them, moved past those."""
    ahead = [
        AheadOfStream(client, ends[client.pk], login.after_position)
        for login, client in admitted
        if login.after_position is not None and login.after_position > ends[client.pk]
    ]
    return catch_streams_up(ahead=ahead) if ahead else {}


def _refused_login(login: Login) -> AuthenticationFailed:
    error = token_refused()
    actor = Actor("agent", login.peer)
    audit.record_error(error, actor=actor, action="agent.login", target="agent-socket")
    return error


def _opened(login: Login, client: Client, last: int) -> OpenedSession:
    after_position = login.after_position
    if after_position is None and login.after_delivery is not None:
        after_position = position_after_delivery(client, login.after_delivery)
    first_page = []
    if (after_position or 0) < last:
        first_page = deliveries_to_replay(
            client,
            after_position=after_position or 0,
            through=last,
            unanswered_only=after_position is None,
            limit=protocol.REPLAY_PAGE,
        )
    return OpenedSession(client, last, after_position, first_page)


def advertisements(all_stated: list[StatedValues]) -> list[BrokerError | None]:
    """Agents state their whole models, those of many sessions at once (a fleet logging
    in; broker.group_commit): each one's refusal, or None. An advertisement must give
    every attribute the client states itself; the accepted ones are written in one
    transaction (and those that state what is stated already write nothing)."""
    owns = own_attributes_of(stated.client for stated in all_stated)
    outcomes = [_incomplete(stated, owns[stated.client.pk]) for stated in all_stated]
    paired = zip(all_stated, outcomes, strict=True)
    complete = [stated for stated, outcome in paired if outcome is None]
    written = iter(state_attributes_of_clients(complete, owns=owns) if complete else [])
    return [outcome or next(written) for outcome in outcomes]


def _incomplete(stated: StatedValues, own: OwnAttributes) -> InvalidInput | None:
    """The (audited) refusal of an advertisement that leaves out attributes the client
    states itself; None if it gives them all."""
    missing = sorted(own.self_stated - set(stated.values))
    if not missing:
        return None
    error = InvalidInput(
        f"an advertisement gives every attribute the client states itself; "
        f"missing: {', '.join(missing)} (use update for some of them)",
        field=f"values.{missing[0]}",
    )
    target = f"client:{stated.client.name}"
    audit.record_error(error, actor=stated.actor, action="attributes.advertise", target=target)
    return error


def updates(all_stated: list[StatedValues]) -> list[BrokerError | None]:
    """Agents change some of their own attributes, those of many sessions at once
    (broker.group_commit): each one's refusal, or None; what was accepted is written in
    one transaction."""
    given = [stated for stated in all_stated if stated.values]
    answered = iter(state_attributes_of_clients(given) if given else [])
    return [next(answered) if stated.values else _nothing_given() for stated in all_stated]


def _nothing_given() -> InvalidInput:
    return InvalidInput("values must name at least one attribute", field="values")


def set_agent_policy(*, client: Client, text: str, actor: Actor) -> int:
    """A new version of the agent's policy; return its number."""
    return set_policy(client=client, text=text, actor=actor).version


def publish(
    *,
    client: Client,
    content: Mapping[str, Any],
    selector: str,
    lifetime_s: int,
    channel: str,
    idempotency_key: str | None,
    actor: Actor,
    signed: SenderSignature | None = None,
) -> dict:
    """Publish as the agent; return the event's id, channel and sequence number."""
    event = publish_event(
        sender=client,
        content=content,
        selector=selector,
        lifetime_s=lifetime_s,
        channel=channel,
        idempotency_key=idempotency_key,
        actor=actor,
        signed=signed,
    )
    return {"event": str(event.pk), "channel": event.channel, "sequence": event.sequence}
