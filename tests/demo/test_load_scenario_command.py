"""`manage.py load_scenario` keeps the authorities' and grants' keys it would otherwise
throw away, in a file only the user reads, and they work with the attestation API as
the README shows."""

import io
import json
import re
import stat

import pytest
from django.core.management import CommandError, call_command
from django.test import Client as HttpClient

from broker.models import AttributeValue, Client, ClientModel, SendTemplate
from broker.reads.clients import attested_attributes
from demo.scenario import CONTROLLERS, trusted_authorities

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


def load(path) -> str:
    output = io.StringIO()
    call_command("load_scenario", "--servers", "2", "--keys-file", str(path), stdout=output)
    return output.getvalue()


def test_the_scenario_keeps_its_keys_in_a_private_file_that_the_api_accepts(tmp_path):
    path = tmp_path / "demo" / "keys.json"

    said = load(path)

    assert str(path) in said
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    keys = json.loads(path.read_text())["authorities"]
    assert set(keys["trust-manager"]["grants"]) == set(CONTROLLERS)
    assert set(keys["macrocorp-inventory"]["grants"]) == {"web-00000", "web-00001"}
    # The README's example: the trust manager raises the rogue controller's trust.
    trust = keys["trust-manager"]
    body = {"grant_key": trust["grants"]["rogue-controller"], "values": {"trust": 2}}
    reply = HttpClient().post(
        "/api/v1/clients/rogue-controller/attestations",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {trust['key']}"},
    )
    assert (reply.status_code, reply.json()) == (200, {"attested": ["trust"]})
    assert attested_attributes(Client.objects.get(name="rogue-controller"))["trust"] == 2


def test_a_keys_file_already_there_is_refused_before_anything_is_loaded(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text('{"authorities": "of another database"}')

    said = rf"^{re.escape(str(path))} already exists: .*--keys-file"
    with pytest.raises(CommandError, match=said):
        load(path)

    assert path.read_text() == '{"authorities": "of another database"}'
    assert not ClientModel.objects.exists()  # nothing whose keys could not be kept
    assert [p.name for p in tmp_path.iterdir()] == ["keys.json"]


def test_without_a_keys_file_the_keys_go_to_the_data_folders_new_file(tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "demo"))
    call_command("load_scenario", "--servers", "2", stdout=io.StringIO())
    assert (tmp_path / "demo" / "keys.json").is_file()


def test_a_scenario_loaded_before_sends_were_kept_gets_them_when_loaded_again(tmp_path):
    load(tmp_path / "keys.json")
    SendTemplate.objects.all().delete()  # as a database loaded before they were kept

    said = load(tmp_path / "keys.json")

    assert "Offered ready-made sends on the Send page: worm-alert, disable-cgi" in said
    assert SendTemplate.objects.count() == 4


def test_loading_again_keeps_the_keys_of_the_first_load(tmp_path):
    path = tmp_path / "keys.json"
    load(path)
    kept = path.read_text()

    said = load(path)

    assert "already loaded" in said
    assert path.read_text() == kept


def test_the_demo_console_holds_the_signing_keys_of_the_trust_manager_and_controllers_once(
    tmp_path,
):
    said = load(tmp_path / "keys.json")
    again = load(tmp_path / "keys.json")

    assert "Made signing keys for trust-manager, intellimune-national" in said
    assert "Made signing keys" not in again
    [public] = trusted_authorities()["trust-manager"]
    signed = AttributeValue.objects.filter(client__name__in=CONTROLLERS, seal__isnull=False)
    assert signed.count() == 4 * len(CONTROLLERS)
    assert {value.seal["client_key"] for value in signed} == set(
        Client.objects.filter(name__in=CONTROLLERS).values_list("signing_key", flat=True)
    )
    assert public.startswith("ed25519:")
