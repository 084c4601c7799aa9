"""The console's audit key: an Ed25519 key whose private half is a file on the host
that runs the beat (`SIGNING_KEYS_DIR/console/audit.pem`), never in the database, and
whose public half the auditors keep (`AUDIT_CHECKPOINT_KEYS`): checkpoints of the
chain are signed with it (auditchain.models.Checkpoint)."""

from __future__ import annotations

from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from sn_agent import signatures

from broker import seals
from broker.services.signing_keys import write_private_key

KIND, NAME = "console", "audit"


def audit_key() -> Ed25519PrivateKey | None:
    """The private key, if this host holds it."""
    return seals.private_key(KIND, NAME)


def make_audit_key() -> Ed25519PrivateKey:
    """The key this host holds, made first if it holds none (written as the senders'
    and authorities' keys are: broker.services.signing_keys.write_private_key).
    InvalidInput without SIGNING_KEYS_DIR."""
    existing = audit_key()
    if existing is not None:
        return existing
    key = signatures.new_private_key()
    write_private_key(KIND, NAME, key)
    return key


def public_key_text(key: Ed25519PrivateKey) -> str:
    return signatures.public_key_text(key.public_key())


def trusted_public_keys() -> set[str]:
    """The public keys checkpoints are checked with: those the settings name (kept by
    the auditors, outside the database), and this host's own key's."""
    trusted = set(settings.AUDIT_CHECKPOINT_KEYS)
    key = audit_key()
    if key is not None:
        trusted.add(public_key_text(key))
    return trusted


def key_made_at() -> datetime | None:
    """When this host's audit key file was written (None: it holds none): checkpoints
    are expected from then on."""
    path = seals.key_path(KIND, NAME)
    if path is None or audit_key() is None:
        return None
    return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
