"""Secrets, tokens and keys: shown once, stored hashed.

Client secrets, tokens and grant keys are long random strings made here, never chosen
by people, so a fast SHA-256 digest is enough (a slow password hash guards against
guessing weak passwords; there is nothing to guess here) and lets us find tokens by
their digest. Operators' passwords are Django users' and keep Django's slow hashers.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.utils import timezone

TOKEN_BYTES = 32


def new_secret(prefix: str) -> str:
    """A fresh random credential such as `snt_...`; the prefix says what it is for."""
    return f"{prefix}_{secrets.token_urlsafe(TOKEN_BYTES)}"


def key_digest(key: str) -> str:
    """The stored form of a token or key."""
    return hashlib.sha256(key.encode()).hexdigest()


def token_expiry(days: int) -> datetime:
    """When a token issued now stops working: `days` from now (CLIENT_TOKEN_DAYS for
    clients' tokens, OPERATOR_TOKEN_DAYS for operators')."""
    return timezone.now() + timedelta(days=days)
