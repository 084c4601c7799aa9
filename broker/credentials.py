"""Secrets, tokens and keys: shown once, stored hashed.

Client secrets are hashed with Django's password hashers (slow on purpose: they are
typed by people). Tokens and grant keys are long random strings, so a fast SHA-256 is
enough and lets us find them by hash.
"""

from __future__ import annotations

import hashlib
import secrets

TOKEN_BYTES = 32


def new_secret(prefix: str) -> str:
    """A fresh random credential such as `snt_...`; the prefix says what it is for."""
    return f"{prefix}_{secrets.token_urlsafe(TOKEN_BYTES)}"


def key_digest(key: str) -> str:
    """The stored form of a token or key."""
    return hashlib.sha256(key.encode()).hexdigest()
