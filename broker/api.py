"""The HTTP API for integrations (a SOAR tool posting alerts, a script reading results).

JSON over HTTP with bearer tokens; the OpenAPI schema is served at
/api/v1/openapi.json (django-ninja builds it from these signatures). Three kinds of
caller, told apart by their token:
- a client (`snt_...`): publishes as itself, previews its receivers, reads its events;
- an operator's integration (`sno_...`): manages clients, reads any event, with the
  operator's Django permissions;
- an authority (`sna_...`): attests and revokes attributes where it was granted.
Every refusal is a JSON error {code, message, field} with a fitting HTTP status, and
every operation's schema declares them. Bodies are JSON (`application/json`) decoded
strictly (broker/inputs.py): no NaN, no \\u0000, no lone surrogates, no deep nesting.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest
from django.utils.datastructures import MultiValueDict
from ninja import NinjaAPI, Path, Query, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as SchemaError
from ninja.parser import Parser
from ninja.security import HttpBearer
from pydantic import AwareDatetime, Field, StrictBool, StrictInt

from broker import audit
from broker.audit import Actor
from broker.errors import AuthenticationFailed, BrokerError, InvalidInput, NotAuthorised, NotFound
from broker.inputs import check_text, client_address, decode_json
from broker.models import Authority, Client, ClientModel
from broker.reads.clients import clients_with_attributes
from broker.reads.events import event_status as status_of_event
from broker.reads.events import event_with_sender, preview_receivers, published_facts
from broker.reads.reach import refusing_unsigned
from broker.services import authorities, clients, events, operators
from broker.services.clients import CLIENT_NAME

logger = logging.getLogger(__name__)


class UnsupportedMediaType(BrokerError):
    code = "unsupported_media_type"


class BodyTooLarge(BrokerError):
    code = "too_large"


class StrictJSONParser(Parser):
    """Bodies are `application/json` only, decoded strictly; query values may not hold
    NUL. Each refusal names the field (ninja reports them through HttpError's cause)."""

    def parse_body(self, request: HttpRequest) -> Any:
        if request.content_type != "application/json":
            raise UnsupportedMediaType(
                f"the body must be application/json, not {request.content_type or 'untyped'}",
                field="Content-Type",
            )
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput("the body is not UTF-8", field="body") from None
        return decode_json(text, whole="body")

    def parse_querydict(
        self, data: MultiValueDict, list_fields: list[str], request: HttpRequest
    ) -> dict[str, Any]:
        for key, values in data.lists():
            for value in values:
                check_text(value, key)
        return super().parse_querydict(data, list_fields, request)


api = NinjaAPI(
    title="Selective Notification API",
    version="1",
    description="Publish events, preview receivers, read delivery status, manage clients "
    "and attestations. The agents' WebSocket protocol is documented in docs/protocol.md.",
    docs_url=None,  # the interactive page would load scripts from a CDN
    urls_namespace="api",
    parser=StrictJSONParser(),
)

STATUS = {
    "invalid": 400,
    "policy_rejected": 400,
    "refused": 400,
    "authentication_failed": 401,
    "not_authorised": 403,
    "not_found": 404,
    "too_large": 413,
    "unsupported_media_type": 415,
    "locked_out": 429,
}
# Where a schema error's location names the kind of parameter rather than the field.
PARAMETER_KINDS = frozenset({"body", "payload", "query", "path"})
MAX_OFFSET = 2**31 - 1
MAX_PAGE = 1000


class ErrorOut(Schema):
    """Every refusal: what is wrong (`code`, `message`) and where (`field`); policy and
    selector errors also carry the position."""

    code: str
    message: str
    field: str | None
    line: int | None = None
    column: int | None = None


# The refusals every operation may answer; those with a body also 413 and 415.
ERRORS = {frozenset({400, 401, 403, 404, 429}): ErrorOut}
BODY_ERRORS = {frozenset({400, 401, 403, 404, 413, 415, 429}): ErrorOut}


@api.exception_handler(BrokerError)
def refused(request: HttpRequest, error: BrokerError):
    response = api.create_response(request, error.as_dict(), status=STATUS.get(error.code, 400))
    if isinstance(error, LockedOut):
        response["Retry-After"] = str(int(settings.AXES_COOLOFF_TIME.total_seconds()))
    return response


@api.exception_handler(SchemaError)
def malformed(request: HttpRequest, error: SchemaError):
    first = error.errors[0]
    where = ".".join(str(part) for part in first["loc"] if part not in PARAMETER_KINDS)
    where = where or "body"
    body = {"code": "invalid", "message": f"{where}: {first['msg']}", "field": where}
    return api.create_response(request, body, status=400)


@api.exception_handler(HttpError)
def unreadable(request: HttpRequest, error: HttpError):
    """ninja wraps what the parser refused; the parser's error says where."""
    if isinstance(error.__cause__, BrokerError):
        return refused(request, error.__cause__)
    code = "invalid" if error.status_code == 400 else "refused"
    body = {"code": code, "message": str(error), "field": None}
    return api.create_response(request, body, status=error.status_code)


@api.exception_handler(RequestDataTooBig)
def too_large(request: HttpRequest, error: RequestDataTooBig):
    return refused(request, BodyTooLarge("the body is too large", field="body"))


@api.exception_handler(Exception)
def failed(request: HttpRequest, error: Exception):
    """The last line of defence: a bug answers JSON, and is logged with its traceback.
    No client input should ever get here (the API's fuzzer checks that)."""
    logger.error("API request failed: %s %s", request.method, request.path, exc_info=error)
    body = {"code": "internal", "message": "the server failed", "field": None}
    return api.create_response(request, body, status=500)


@api.exception_handler(AuthenticationError)
def unauthenticated(request: HttpRequest, error: AuthenticationError):
    body = AuthenticationFailed("a valid bearer token is needed").as_dict()
    return api.create_response(request, body, status=401)


# Who is calling -------------------------------------------------------------------------


class LockedOut(BrokerError):
    """Too many unknown tokens from this address lately: refused for a cool-off."""

    code = "locked_out"


# Guessing tokens is bounded as guessing passwords is (the console's login lockout):
# LOGIN_FAILURE_LIMIT unknown tokens from one address within LOGIN_COOLOFF_MIN minutes
# refuse every request from it with 429 until that long after its last failure, even
# with a good token. Counted in the cache (Redis), which every web process shares.
def token_failures_key(address: str) -> str:
    """The cache key counting unknown tokens from `address`."""
    return f"api-token-failures:{address}"


def _authenticated(request: HttpRequest, authenticate, token: str):
    """`authenticate(token)` unless the address is locked out; a failure counts."""
    address = client_address(request)
    key = token_failures_key(address)
    window = int(settings.AXES_COOLOFF_TIME.total_seconds())
    if cache.get(key, 0) >= settings.AXES_FAILURE_LIMIT:
        cache.touch(key, window)
        audit.record_refusal(
            actor=Actor("address", address),
            action="api.authenticate",
            target=request.path[: audit.SHORT_TEXT],
            reason="locked out: too many unknown tokens from this address",
            details={"locked_out": True},
        )
        raise LockedOut("too many unknown tokens from this address: try again later")
    try:
        return authenticate(token)
    except AuthenticationFailed:
        cache.add(key, 0, window)
        cache.incr(key)
        cache.touch(key, window)
        raise


class ClientToken(HttpBearer):
    openapi_scheme = "bearer"

    def authenticate(self, request, token: str) -> Client | None:
        if not token.startswith("snt_"):
            return None
        return _authenticated(request, clients.authenticate_client, token)


class OperatorToken(HttpBearer):
    def authenticate(self, request, token: str):
        if not token.startswith("sno_"):
            return None
        return _authenticated(request, operators.authenticate_operator, token)


class AuthorityKey(HttpBearer):
    def authenticate(self, request, token: str) -> Authority | None:
        if not token.startswith("sna_"):
            return None
        return _authenticated(request, authorities.authenticate_authority, token)


def operator_with(request: HttpRequest, permission: str, action: str, target: str) -> Actor:
    """The calling operator as an audit actor, if they hold `permission`."""
    user = request.auth
    actor = Actor("user", user.username)
    if not user.has_perm(permission):
        error = NotAuthorised(f"{user.username} lacks the permission {permission}")
        audit.record_refusal(
            actor=actor,
            action=action,
            target=target,
            reason=error.message,
            details={"category": audit.ROLE_REFUSED},
        )
        raise error
    return actor


# Events ---------------------------------------------------------------------------------


# The event service checks content and channel (and audits refusals); the schema
# states the same rules for readers and generators of requests.
CONTENT_RULES = {
    "minProperties": 1,
    "maxProperties": events.MAX_CONTENT_ATTRIBUTES,
    "propertyNames": {"pattern": events.CONTENT_NAME.pattern},
    "additionalProperties": {"type": ["string", "number", "boolean"]},
}


class EventIn(Schema):
    content: dict[str, Any] = Field(json_schema_extra=CONTENT_RULES)
    selector: str = ""
    lifetime_s: StrictInt = Field(
        60, json_schema_extra={"minimum": 1, "maximum": events.MAX_LIFETIME_S}
    )
    channel: str = Field("default", json_schema_extra={"pattern": events.CHANNEL_NAME.pattern})
    # Or the Idempotency-Key header: publishing again with it returns the first event.
    idempotency_key: str | None = Field(
        None, json_schema_extra={"pattern": events.IDEMPOTENCY_KEY.pattern}
    )
    # A signed event (docs/security.md, "Signed events"): its id, chosen by the
    # sender, the signing time in Unix seconds, and the Ed25519 signature in base64.
    id: UUID | None = None
    signed_at: StrictInt | None = None
    signature: str | None = None


class UnsignedOut(Schema):
    # Of the receivers an unsigned event reaches, those whose agents act only on signed
    # events (they say so at login): each will refuse it.
    reached: int
    verifying_receivers: int
    message: str


class PublishedOut(Schema):
    event: UUID
    channel: str
    sequence: int
    published_at: datetime
    expires_at: datetime
    # Only for an event published without its sender's signature.
    unsigned: UnsignedOut | None = None


class PreviewIn(Schema):
    content: dict[str, Any] = Field(json_schema_extra=CONTENT_RULES)
    selector: str = ""


class PreviewOut(Schema):
    count: int
    receivers: list[str]


class DeliveryOut(Schema):
    receiver: str
    position: int
    state: str
    delivered_at: datetime
    received_at: datetime | None
    acked_at: datetime | None
    result: dict[str, Any] | None


class EventStatusOut(Schema):
    event: UUID
    sender: str
    channel: str
    sequence: int
    content: dict[str, Any]
    selector: str
    published_at: datetime
    expires_at: datetime
    counts: dict[str, int]
    # True once retention dropped its deliveries: `counts` are as they were then, and
    # `deliveries` is empty (each receiver's is in the reports' dataset).
    archived: bool
    deliveries: list[DeliveryOut]


@api.post(
    "/events", auth=ClientToken(), response={201: PublishedOut, **BODY_ERRORS}, tags=["events"]
)
def publish(request: HttpRequest, payload: EventIn):
    """Publish an event as the calling client; it is routed once committed. With an
    idempotency key (field or `Idempotency-Key` header) the client used before, the
    first event is returned and nothing is published again."""
    fields = payload.dict()
    fields["idempotency_key"] = _idempotency_key(request, fields["idempotency_key"])
    fields["signed"] = events.sender_signature(
        event_id=fields.pop("id"),
        signed_at=fields.pop("signed_at"),
        signature=fields.pop("signature"),
    )
    event = events.publish_event(
        sender=request.auth, actor=Actor("client", request.auth.name), **fields
    )
    facts = published_facts(event)
    if event.seal is None:
        facts["unsigned"] = _refusals_to_come(request.auth, event)
    return 201, facts


def _refusals_to_come(sender: Client, event) -> dict:
    """What an unsigned event meets: how many of the receivers it reaches verify
    signatures, and will refuse it."""
    selector = events.check_event(sender=sender, content=event.content, selector=event.selector)
    reached, verifying = refusing_unsigned(sender=sender, content=event.content, selector=selector)
    message = (
        f"the event is not signed: {verifying} of the {reached} receivers it reaches verify "
        "signatures and will refuse it; sign it with the sender's key "
        "(sn-agent publish, docs/security.md)"
    )
    return {"reached": reached, "verifying_receivers": verifying, "message": message}


def _idempotency_key(request: HttpRequest, in_body: str | None) -> str | None:
    in_header = request.headers.get("Idempotency-Key")
    if in_header is not None and in_body is not None and in_header != in_body:
        raise InvalidInput(
            "the Idempotency-Key header and idempotency_key differ", field="idempotency_key"
        )
    return in_body if in_body is not None else in_header


@api.post(
    "/events/preview",
    auth=ClientToken(),
    response={200: PreviewOut, **BODY_ERRORS},
    tags=["events"],
)
def preview(request: HttpRequest, payload: PreviewIn):
    """Who would receive this event if the calling client published it now."""
    selector = events.check_event(
        sender=request.auth, content=payload.content, selector=payload.selector
    )
    names = preview_receivers(sender=request.auth, content=payload.content, selector=selector)
    return {"count": len(names), "receivers": names}


@api.get(
    "/events/{event_id}",
    auth=[ClientToken(), OperatorToken()],
    response={200: EventStatusOut, **ERRORS},
    tags=["events"],
)
def event_status(request: HttpRequest, event_id: UUID):
    """An event and what became of it at each receiver. Clients see their own events;
    operators need the permission to view deliveries."""
    event = event_with_sender(event_id)
    if isinstance(request.auth, Client):
        if event is None or event.sender_id != request.auth.pk:
            raise NotFound(f"no event {event_id} sent by {request.auth.name}", field="event_id")
    else:
        operator_with(request, "broker.view_delivery", "event.read", f"event:{event_id}")
        if event is None:
            raise NotFound(f"no event {event_id}", field="event_id")
    return status_of_event(event)


# Clients --------------------------------------------------------------------------------


class ClientIn(Schema):
    name: str = Field(json_schema_extra={"pattern": CLIENT_NAME.pattern})
    model: str
    can_send: StrictBool = False
    can_receive: StrictBool = True


class ClientOut(Schema):
    name: str
    model: str
    can_send: bool
    can_receive: bool
    is_active: bool
    attributes: dict[str, Any]


class RegisteredOut(Schema):
    name: str
    secret: str


class TokenOut(Schema):
    token: str


class RevokedOut(Schema):
    revoked: int


@api.get(
    "/clients", auth=OperatorToken(), response={200: list[ClientOut], **ERRORS}, tags=["clients"]
)
def list_clients(
    request: HttpRequest,
    model: str = "",
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
):
    """Clients with their current attributes, by name, a page at a time."""
    operator_with(request, "broker.view_client", "client.list", "clients")
    query = Client.objects.order_by("name")
    if model:
        query = query.filter(model__name=model)
    return clients_with_attributes(query, offset=offset, limit=limit)


@api.post(
    "/clients", auth=OperatorToken(), response={201: RegisteredOut, **BODY_ERRORS}, tags=["clients"]
)
def register(request: HttpRequest, payload: ClientIn):
    """Register a client; its secret is in this answer only."""
    actor = operator_with(request, "broker.add_client", "client.register", payload.name)
    model = ClientModel.objects.filter(name=payload.model).first()
    if model is None:
        raise NotFound(f"no client model named {payload.model!r}", field="model")
    client, secret = clients.register_client(
        name=payload.name,
        model=model,
        can_send=payload.can_send,
        can_receive=payload.can_receive,
        actor=actor,
    )
    return 201, {"name": client.name, "secret": secret}


def _client_named(name: str) -> Client:
    client = Client.objects.select_related("model").filter(name=name).first()
    if client is None:
        raise NotFound(f"no client named {name!r}", field="name")
    return client


# A path's client name: one that cannot exist is refused before any lookup.
ClientName = Path(..., pattern=CLIENT_NAME.pattern)


@api.post(
    "/clients/{name}/tokens",
    auth=OperatorToken(),
    response={201: TokenOut, **ERRORS},
    tags=["clients"],
)
def issue_token(request: HttpRequest, name: str = ClientName):
    """A new token for a provisioned agent; shown in this answer only."""
    actor = operator_with(request, "broker.change_client", "client.issue_token", name)
    return 201, {"token": clients.issue_token(client=_client_named(name), actor=actor)}


@api.delete(
    "/clients/{name}/tokens",
    auth=OperatorToken(),
    response={200: RevokedOut, **ERRORS},
    tags=["clients"],
)
def revoke_tokens(request: HttpRequest, name: str = ClientName):
    """Revoke every token of a client; its open sessions end."""
    actor = operator_with(request, "broker.change_client", "client.revoke_tokens", name)
    return {"revoked": clients.revoke_tokens(client=_client_named(name), actor=actor)}


# Attestations ---------------------------------------------------------------------------


class AttestationIn(Schema):
    grant_key: str
    values: dict[str, Any]
    expires_at: AwareDatetime | None = None
    # The authority's own signature of each value (docs/security.md, "Signed events"):
    # the signing time in Unix seconds, and {name: Ed25519 signature in base64}.
    signed_at: StrictInt | None = None
    signatures: dict[str, str] | None = None


class SigningKeyOut(Schema):
    client: str
    signing_key: str


class AttestedOut(Schema):
    attested: list[str]


class RevocationIn(Schema):
    names: list[str]


@api.post(
    "/clients/{name}/attestations",
    auth=AuthorityKey(),
    response={200: AttestedOut, **BODY_ERRORS},
    tags=["attestations"],
)
def attest(request: HttpRequest, payload: AttestationIn, name: str = ClientName):
    """The calling authority sets attributes on a client that granted it permission."""
    signed = None
    if payload.signatures is not None or payload.signed_at is not None:
        signed = {"signed_at": payload.signed_at, "signatures": payload.signatures}
    authorities.attest_attributes(
        authority=request.auth,
        client=_client_named(name),
        grant_key=payload.grant_key,
        values=payload.values,
        expires_at=payload.expires_at,
        signed=signed,
    )
    return {"attested": sorted(payload.values)}


@api.get(
    "/clients/{name}/signing-key",
    auth=AuthorityKey(),
    response={200: SigningKeyOut, **ERRORS},
    tags=["attestations"],
)
def signing_key(request: HttpRequest, name: str = ClientName):
    """The public key a client signs its events with, which an authority's signed
    attestations bind (compare its fingerprint with the client's owner before signing:
    whoever writes the console's database could change it)."""
    client = _client_named(name)
    return {"client": client.name, "signing_key": client.signing_key}


@api.post(
    "/clients/{name}/attestations/revoke",
    auth=AuthorityKey(),
    response={200: RevokedOut, **BODY_ERRORS},
    tags=["attestations"],
)
def revoke_attestation(request: HttpRequest, payload: RevocationIn, name: str = ClientName):
    """The calling authority withdraws values it attested."""
    count = authorities.revoke_attestation(
        authority=request.auth, client=_client_named(name), names=payload.names
    )
    return {"revoked": count}
