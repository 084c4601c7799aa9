"""The private keys the console signs with are never lost: a rotation puts the new key
in place at once and keeps the old one aside, and so does giving an authority's key up
for one it keeps in its own tooling (broker/services/signing_keys.py)."""

from __future__ import annotations

import stat

import pytest
from sn_agent.signatures import new_private_key, public_key_text

from broker import seals
from broker.services.signing_keys import make_authority_key, make_sender_key, set_authority_key
from demo.scenario import load_scenario
from tests.broker.agent_helpers import ISSUER

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


@pytest.fixture
def scenario(settings, tmp_path):
    settings.SIGNING_KEYS_DIR = str(tmp_path)
    return load_scenario(servers=2)


def aside(path) -> list:
    return sorted(path.parent.glob(f"{path.name}.replaced-*"))


def test_a_senders_rotated_key_is_kept_aside_and_the_new_one_signs(scenario):
    national = scenario.controllers["intellimune-national"]
    first = make_sender_key(client=national, actor=ISSUER)
    path = seals.key_path(seals.SENDERS, national.name)
    first_pem = path.read_bytes()

    second = make_sender_key(client=national, actor=ISSUER)

    [kept] = aside(path)
    assert kept.read_bytes() == first_pem
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert public_key_text(seals.private_key(seals.SENDERS, national.name).public_key()) == second
    assert second != first


def test_an_authoritys_key_given_up_for_its_own_tooling_is_kept_aside(scenario):
    made = make_authority_key(authority=scenario.trust_manager, actor=ISSUER)
    path = seals.key_path(seals.AUTHORITIES, "trust-manager")
    pem = path.read_bytes()
    own = public_key_text(new_private_key().public_key())

    set_authority_key(authority=scenario.trust_manager, public_key=own, actor=ISSUER)

    assert not path.exists()  # the console signs for it no more
    assert seals.private_key(seals.AUTHORITIES, "trust-manager") is None
    [kept] = aside(path)
    assert kept.read_bytes() == pem and made.startswith("ed25519:")


def test_each_rotation_keeps_its_own_old_key(scenario):
    authority = scenario.trust_manager
    for _ in range(3):
        make_authority_key(authority=authority, actor=ISSUER)
    path = seals.key_path(seals.AUTHORITIES, authority.name)
    assert len(aside(path)) == 2
    assert len({kept.read_bytes() for kept in aside(path)} | {path.read_bytes()}) == 3
