"""Ready-made sends (broker.services.sending.save_send_template): kept by the service,
checked as publishing checks an event, audited; the Send page offers what is kept."""

from __future__ import annotations

import pytest

from broker.audit import Actor
from broker.errors import InvalidInput, NotAuthorised, PolicyRejected
from broker.models import AuditEntry, SendTemplate
from broker.reads.sending import send_templates
from broker.services.sending import Draft, save_send_template
from demo.scenario import SEND_TEMPLATES, load_scenario, offer_send_templates

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

AUTHOR = Actor("user", "olivia")


@pytest.fixture
def scenario():
    return load_scenario(servers=2)


def status_draft(scenario, **changes) -> Draft:
    fields = {
        "sender": scenario.controllers["intellimune-national"],
        "content": {"kind": "command", "action": "status"},
        "selector": 'region == "Southeast"',
        "lifetime_s": 120,
        "channel": "commands",
    }
    return Draft(**{**fields, **changes})


def test_the_scenario_offers_its_sends_once_in_its_order(scenario):
    assert [t.slug for t in send_templates()] == [t.slug for t in SEND_TEMPLATES]
    assert offer_send_templates() == []  # offered already
    worm = send_templates()[0]
    assert (worm.sender.name, worm.selector, worm.channel) == (
        "northwest-controller", 'region == "Northwest"', "alerts",
    )  # fmt: skip


def test_a_saved_send_is_offered_and_audited_and_a_slug_saved_again_replaces_it(scenario):
    save_send_template(slug="status-se", title="Status", draft=status_draft(scenario), actor=AUTHOR)
    again = status_draft(scenario, lifetime_s=300)
    save_send_template(slug="status-se", title="Status, longer", draft=again, actor=AUTHOR)

    kept = SendTemplate.objects.get(slug="status-se")
    assert (kept.title, kept.lifetime_s) == ("Status, longer", 300)
    target = "send_template:status-se"
    entries = AuditEntry.objects.filter(action="send_template.save", target=target)
    assert [e.details["replaced"] for e in entries.order_by("id")] == [False, True]
    assert send_templates()[-1].slug == "status-se"


def test_a_send_that_could_not_be_published_is_refused_naming_its_field(scenario):
    typo = status_draft(scenario, selector='regoin == "Southeast"')
    with pytest.raises(PolicyRejected, match="did you mean 'region'") as refused:
        save_send_template(slug="typo", title="Typo", draft=typo, actor=AUTHOR)
    assert refused.value.field == "selector"
    with pytest.raises(NotAuthorised):
        server = scenario.servers[0]  # receives only
        save_send_template(slug="x", title="X", draft=status_draft(scenario, sender=server),
                           actor=AUTHOR)  # fmt: skip
    assert not SendTemplate.objects.filter(slug__in=["typo", "x"]).exists()


@pytest.mark.parametrize(
    ("slug", "title", "field"),
    [("Worm Alert", "t", "slug"), ("-worm", "t", "slug"), ("w" * 65, "t", "slug"),
     ("worm", " ", "title"), ("worm", "t" * 201, "title")],
)  # fmt: skip
def test_a_slug_or_title_out_of_shape_is_refused_and_audited(scenario, slug, title, field):
    with pytest.raises(InvalidInput) as refused:
        save_send_template(slug=slug, title=title, draft=status_draft(scenario), actor=AUTHOR)
    assert refused.value.field == field
    entry = AuditEntry.objects.using("audit").get(action="send_template.save", outcome="refused")
    assert entry.details["field"] == field
