"""Policies saved before event attributes were declared keep their meaning: the
migration declares what they test, with the type their literals had."""

import importlib.util
from pathlib import Path

import pytest
from django.apps import apps

import broker.migrations
from broker.audit import Actor
from broker.models import EventAttribute, PolicyVersion
from broker.services.clients import create_client_model, register_client
from demo.scenario import WEB_SERVER_ATTRIBUTES

pytestmark = pytest.mark.django_db
SETUP = Actor("system", "test")
# Saved as they were before typing: nothing was declared then.
LEGACY_POLICIES = [
    'accept event.kind == "command" or (event.alert exists and event.threat_level >= 4)',
    "accept event.load > 0.5 or event.load < 1",
    'accept event.mixed == 1 or event.mixed == "one"',
]


def migration():
    path = next(Path(broker.migrations.__file__).parent.glob("*_event_attributes.py"))
    spec = importlib.util.spec_from_file_location("event_attributes_migration", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_migration_declares_what_saved_policies_test_with_their_literals_types():
    model = create_client_model(name="web-server", attributes=WEB_SERVER_ATTRIBUTES, actor=SETUP)
    for index, text in enumerate(LEGACY_POLICIES):
        client, _ = register_client(
            name=f"web-{index}", model=model, can_send=False, can_receive=True, actor=SETUP
        )
        PolicyVersion.objects.create(
            client=client, version=1, text=text, canonical_text=text, created_by="legacy"
        )
    migration().declare_what_saved_policies_test(apps, None)
    assert dict(EventAttribute.objects.values_list("name", "type")) == {
        "kind": "string",
        "alert": "string",  # only tested with `exists`: text
        "threat_level": "int",
        "load": "float",  # ints and floats together
    }  # `mixed` cannot be typed and is left out
