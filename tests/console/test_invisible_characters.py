"""Invisible characters (a right-to-left override, a zero-width space) in content, names,
attribute values and policies are spelled out as ⟨U+202E⟩ on every page and in every
CSV; the send preview warns about them."""

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from broker.audit import Actor
from broker.roles import OPERATOR
from broker.services.clients import state_attributes
from broker.services.events import publish_event
from broker.services.policies import set_policy
from broker.services.sending import grant_sending
from demo.scenario import WEB_SERVER_POLICY, load_scenario

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

OVERRIDE = "\u202eevil\u202c"  # displays as "live"
SHOWN = "⟨U+202E⟩evil⟨U+202C⟩"


@pytest.fixture
def scenario():
    return load_scenario(servers=2)


@pytest.fixture
def hidden_event(scenario):
    sender = scenario.controllers["northwest-controller"]
    return publish_event(sender=sender, content={"kind": "alert", "alert": OVERRIDE})


def assert_shown_visibly(body: str) -> None:
    assert SHOWN in body
    assert "\u202e" not in body and "\u202c" not in body


def test_the_event_and_why_pages_spell_out_a_right_to_left_override(as_auditor, hidden_event):
    assert_shown_visibly(as_auditor.get(reverse("event", args=[hidden_event.pk])).content.decode())
    why = reverse("event-why", args=[hidden_event.pk, "web-00000"])
    assert_shown_visibly(as_auditor.get(why).content.decode())
    assert_shown_visibly(as_auditor.get(reverse("events")).content.decode())


def test_an_attribute_value_and_a_policy_are_spelled_out_on_the_client_page(as_auditor, scenario):
    server = scenario.servers[0]
    actor = Actor("client", server.name)
    state_attributes(client=server, values={"software": "II\u200bS"}, actor=actor)
    set_policy(client=server, text=WEB_SERVER_POLICY + f"\n# {OVERRIDE}", actor=actor)
    body = as_auditor.get(reverse("client", args=[server.name])).content.decode()
    assert "II⟨U+200B⟩S" in body
    assert_shown_visibly(body)


def test_the_audit_csv_spells_them_out(as_auditor, scenario):
    server = scenario.servers[0]
    state_attributes(client=server, values={"software": OVERRIDE}, actor=Actor("client", "x"))
    response = as_auditor.get(reverse("audit-export"))
    text = b"".join(response.streaming_content).decode()
    assert_shown_visibly(text)


def test_the_send_preview_warns_where_invisible_characters_hide(as_operator, scenario):
    grant_sending(
        client=scenario.controllers["northwest-controller"],
        holder=Group.objects.get(name=OPERATOR.name),
        actor=Actor("test", "t"),
    )
    fields = {
        "sender": "northwest-controller",
        "content_name": ["kind", "alert"],
        "content_value": ["alert", OVERRIDE],
        "selector": 'region == "North\u200bwest"',
        "lifetime_s": "60",
        "channel": "alerts",
    }
    body = as_operator.post(reverse("send-preview"), fields).content.decode()
    warning = body.split("data-invisible")[1].split("</div>")[0]
    assert "<code>content.alert</code>: U+202C POP DIRECTIONAL FORMATTING, U+202E" in warning
    assert "<code>selector</code>: U+200B ZERO WIDTH SPACE" in warning


def test_a_page_without_them_is_left_as_it_was(as_auditor, scenario):
    body = as_auditor.get(reverse("fleet")).content.decode()
    assert "⟨U+" not in body
