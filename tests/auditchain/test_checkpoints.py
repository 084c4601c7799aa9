"""Signed checkpoints of the audit chain: the newest entries cut off with their links,
a chain made again, and checkpoints forged or removed are each found."""

import os
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from sn_agent import signatures

from auditchain import keys
from auditchain.models import Checkpoint
from auditchain.services import link_entries, sign_checkpoint
from auditchain.verification import CUT, STALE, UNSIGNED, findings
from broker import audit
from broker.audit import Actor

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])
OFFICER = Actor("user", "audrey")


def sql(statement: str, parameters=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, parameters)


def problems() -> list[str]:
    return [finding.problem for finding in findings()]


@pytest.fixture
def signed(tmp_path, settings) -> Checkpoint:
    """Five entries linked, and the chain's head signed with this host's audit key."""
    settings.SIGNING_KEYS_DIR = str(tmp_path)
    keys.make_audit_key()
    for n in range(5):
        audit.record_change(actor=OFFICER, action="policy.set", target=f"client:web-{n}")
    link_entries()
    return sign_checkpoint()


def test_a_signed_checkpoint_verifies_and_the_key_file_is_private(signed, tmp_path):
    assert signed.position == 5 and problems() == []
    assert (tmp_path / "console" / "audit.pem").stat().st_mode & 0o777 == 0o600


def test_the_newest_entries_cut_off_with_their_links_are_found(signed):
    sql("DELETE FROM broker_auditentry WHERE id IN"
        " (SELECT entry_id FROM auditchain_auditlink WHERE position > 3)")  # fmt: skip
    sql("DELETE FROM auditchain_auditlink WHERE position > 3")
    sql("UPDATE auditchain_chainhead SET position = 3")
    assert problems() == [CUT]


def test_a_checkpoint_moved_onto_a_chain_made_again_does_not_hold(signed):
    sql("UPDATE auditchain_checkpoint SET chain = repeat('0', 64)")
    assert problems() == [UNSIGNED]


def test_a_checkpoint_signed_with_a_key_the_auditors_do_not_trust_does_not_hold(signed):
    forger = signatures.new_private_key()
    forged = Checkpoint(position=5, chain=signed.chain, signed_at=timezone.now(),
                        public_key=signatures.public_key_text(forger.public_key()))  # fmt: skip
    forged.signature = signatures.sign(forger, forged.document())
    forged.save()
    assert problems() == [UNSIGNED]


def test_checkpoints_removed_are_found_on_a_host_that_signs_them(signed, tmp_path):
    key_file = tmp_path / "console" / "audit.pem"
    Checkpoint.objects.all().delete()
    assert problems() == []  # the key is new: its first checkpoint is not due yet
    hours_ago = time.time() - 3 * 3600
    os.utime(key_file, (hours_ago, hours_ago))
    assert problems() == [STALE]
    sign_checkpoint()
    assert problems() == []


def test_without_the_key_no_checkpoint_is_signed_and_none_is_expected(settings, tmp_path):
    settings.SIGNING_KEYS_DIR = str(tmp_path)
    audit.record_change(actor=OFFICER, action="policy.set", target="client:web-1")
    link_entries()
    assert sign_checkpoint() is None and problems() == []


def test_the_public_keys_the_auditors_keep_check_checkpoints_on_a_host_without_the_key(
    signed, settings, tmp_path
):
    public = keys.public_key_text(keys.audit_key())
    (tmp_path / "console" / "audit.pem").unlink()
    settings.AUDIT_CHECKPOINT_KEYS = [public]
    assert problems() == []
    settings.AUDIT_CHECKPOINT_KEYS = []
    assert problems() == [UNSIGNED]
    assert timedelta(0) <= timezone.now() - signed.signed_at
