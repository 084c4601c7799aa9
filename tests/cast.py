"""The fixed cast of people the tests use, instead of random fixtures."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model


@dataclass(frozen=True)
class Member:
    username: str
    password: str
    is_staff: bool = False
    is_superuser: bool = False


OPERATOR = Member("olivia", "olivia-sees-the-fleet-42")
ADMINISTRATOR = Member("adam", "adam-runs-the-console-42", is_staff=True, is_superuser=True)


def create_member(member: Member):
    """Create `member` as a Django user and return it."""
    return get_user_model().objects.create_user(
        username=member.username,
        password=member.password,
        is_staff=member.is_staff,
        is_superuser=member.is_superuser,
    )
