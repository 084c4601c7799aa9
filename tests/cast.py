"""The fixed cast of people the tests use, instead of random fixtures."""

from __future__ import annotations

import hashlib
import time
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
    give_authenticator(user, member)
    return user


def give_authenticator(user, member: Member):
    """A confirmed authenticator for `user` whose key follows from `member`, so that a
    test (or a browser driven by one) can compute its codes without the database."""
    from django_otp.plugins.otp_totp.models import TOTPDevice

    # A code is refused once used (replay); accepting steps ±10 lets a test log in
    # and confirm several times a minute, each with the next step's code.
    return TOTPDevice.objects.create(
        user=user, name="test", key=authenticator_key(member), confirmed=True, tolerance=10
    )


def authenticator_key(member: Member) -> str:
    return hashlib.sha1(f"authenticator of {member.username}".encode()).hexdigest()


_last_step: dict[str, int] = {}
TOTP_STEP_S = 30


def next_code(member: Member) -> str:
    """A code of `member`'s authenticator not used yet by this test process."""
    from django_otp.oath import hotp

    step = max(int(time.time()) // TOTP_STEP_S, _last_step.get(member.username, -1) + 1)
    _last_step[member.username] = step
    return f"{hotp(bytes.fromhex(authenticator_key(member)), step):06d}"


def second_factor_proved(client, user) -> None:
    """Mark the test client's session as having proved `user`'s second factor just
    now, as the second factor's page does (the login itself is force_login's), timed
    and sealed with the user's roles as the login and the pages before leave it."""
    from django_otp import DEVICE_ID_SESSION_KEY
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from broker.roles import needs_second_factor
    from console.access import CODE_TYPED_AT
    from console.sessions import ACTIVE_AT, ROLES_SEEN, STARTED_AT, roles_seal

    device = TOTPDevice.objects.filter(user=user, confirmed=True).first()
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = device.persistent_id
    session[CODE_TYPED_AT] = session[STARTED_AT] = time.time()
    if needs_second_factor(user):
        session[ACTIVE_AT] = session[STARTED_AT]  # only acting roles' activity is timed
    session[ROLES_SEEN] = roles_seal(user)
    session.save()


def log_in_proved(client, user):
    """`client` logged in as `user` with their second factor proved."""
    client.force_login(user)
    second_factor_proved(client, user)
    return client


@cache
def password_hash(password: str) -> str:
    """`password` hashed as Django stores it, once per test process: the hasher takes
    half a second on purpose, and most tests create their cast anew. A salted hash
    checks the same whichever salt it has, so every login still checks it for real."""
    from django.contrib.auth.hashers import make_password

    return make_password(password)
