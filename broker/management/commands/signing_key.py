"""Make or record signing keys (docs/security.md, "Signed events")."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from broker.audit import Actor
from broker.errors import BrokerError
from broker.models import Authority, Client
from broker.services.signing_keys import (
    make_authority_key,
    make_sender_key,
    set_authority_key,
    set_signing_key,
)


class Command(BaseCommand):
    help = (
        "sender NAME: make a key pair for a sender the console sends for (private key in "
        "SIGNING_KEYS_DIR), or, with --public-key, record the key of a sender that signs "
        "its own events. authority NAME: make the key the console signs that authority's "
        "attestations with, and print the public key for the agents' [trust]; with "
        "--public-key, record the key of an authority that signs with its own tooling. "
        "Audited."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("kind", choices=["sender", "authority"])
        parser.add_argument("name")
        parser.add_argument("--public-key", help="ed25519:BASE64: a key kept by its owner")

    def handle(self, *args, kind: str, name: str, public_key: str | None, **options) -> None:
        actor = Actor("system", "manage.py")
        try:
            if kind == "authority" and public_key:
                set_authority_key(authority=_authority(name), public_key=public_key, actor=actor)
                printed = public_key
            elif kind == "authority":
                printed = make_authority_key(authority=_authority(name), actor=actor)
            elif public_key:
                set_signing_key(client=_sender(name), public_key=public_key, actor=actor)
                printed = public_key
            else:
                printed = make_sender_key(client=_sender(name), actor=actor)
        except BrokerError as error:
            raise CommandError(f"{error.field}: {error.message}") from None
        self.stdout.write(printed)


def _sender(name: str) -> Client:
    client = Client.objects.filter(name=name, can_send=True).first()
    if client is None:
        raise CommandError(f"no sender client named {name!r}")
    return client


def _authority(name: str) -> Authority:
    authority = Authority.objects.filter(name=name).first()
    if authority is None:
        raise CommandError(f"no authority named {name!r}")
    return authority
