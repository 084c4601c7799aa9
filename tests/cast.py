"""The fixed cast of people the tests use, instead of random fixtures."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.contrib.auth import get_user_model


@dataclass(frozen=True)
class Member:
    username: str
    password: str
    is_staff: bool = False
    is_superuser: bool = False
    role: str = ""  # the console role (a group) they hold


OPERATOR = Member("olivia", "olivia-sees-the-fleet-42", role="operator")
POLICY_AUTHOR = Member("paula", "paula-writes-policies-42", role="policy author")
TRUST_OFFICER = Member("trevor", "trevor-attests-trust-42", role="trust officer")
AUDITOR = Member("audrey", "audrey-reads-everything-42", role="auditor")
ADMINISTRATOR = Member("adam", "adam-runs-the-console-42", is_staff=True, is_superuser=True)


def create_member(member: Member):
    """Create `member` as a Django user in their role and return it."""
    from django.contrib.auth.models import Group

    user = get_user_model().objects.create(
        username=member.username,
        password=password_hash(member.password),
        is_staff=member.is_staff,
        is_superuser=member.is_superuser,
    )
    if member.role:
        user.groups.add(Group.objects.get(name=member.role))
    return user


@cache
def password_hash(password: str) -> str:
    """`password` hashed as Django stores it, once per test process: the hasher takes
    half a second on purpose, and most tests create their cast anew. A salted hash
    checks the same whichever salt it has, so every login still checks it for real."""
    from django.contrib.auth.hashers import make_password

    return make_password(password)
