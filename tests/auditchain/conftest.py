"""Each test starts with no audit key on this host (SIGNING_KEYS_DIR of its own): the
suite's other tests make one (demo.scenario.ensure_signing_keys)."""

import pytest


@pytest.fixture(autouse=True)
def no_audit_key(tmp_path_factory, settings):
    settings.SIGNING_KEYS_DIR = str(tmp_path_factory.mktemp("signing-keys"))
