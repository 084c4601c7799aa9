"""The event vocabulary: declared once with a type that never changes, audited."""

import pytest

from broker.audit import Actor
from broker.errors import InvalidInput
from broker.models import AuditEntry, EventAttribute
from broker.services.event_attributes import EventAttributeSpec, declare_event_attributes

pytestmark = pytest.mark.django_db(databases=["default", "audit"])
OPERATOR = Actor("user", "olivia")


def declared() -> dict[str, str]:
    return dict(EventAttribute.objects.values_list("name", "type"))


def test_declaring_event_attributes_records_their_types_and_audits_the_change():
    declare_event_attributes(
        attributes=[
            EventAttributeSpec("kind", "string", "alert or command"),
            EventAttributeSpec("threat_level", "int"),
        ],
        actor=OPERATOR,
    )
    assert declared() == {"kind": "string", "threat_level": "int"}
    change = AuditEntry.objects.get(action="event_attribute.declare", outcome="done")
    assert change.actor == "user:olivia"
    assert change.details == {"declared": {"kind": "string", "threat_level": "int"}}


def test_declaring_a_name_again_with_its_type_changes_nothing():
    declare_event_attributes(attributes=[EventAttributeSpec("kind", "string", "a")], actor=OPERATOR)
    again = declare_event_attributes(
        attributes=[EventAttributeSpec("kind", "string", "b")], actor=OPERATOR
    )
    assert [(a.name, a.description) for a in again] == [("kind", "a")]
    assert AuditEntry.objects.filter(action="event_attribute.declare").count() == 1


def test_a_declared_type_never_changes_and_the_refusal_is_audited():
    declare_event_attributes(attributes=[EventAttributeSpec("version", "string")], actor=OPERATOR)
    with pytest.raises(InvalidInput) as refused:
        declare_event_attributes(
            attributes=[
                EventAttributeSpec("urgent", "bool"),
                EventAttributeSpec("version", "version"),
            ],
            actor=OPERATOR,
        )
    assert refused.value.field == "attributes.version"
    assert refused.value.message.startswith("event attribute version is declared as string")
    assert declared() == {"version": "string"}  # all or none: urgent was not declared
    refusal = AuditEntry.objects.using("audit").get(
        action="event_attribute.declare", outcome="refused"
    )
    assert refusal.details["field"] == "attributes.version"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (EventAttributeSpec("sender", "string"), "cannot name an event attribute"),
        (EventAttributeSpec("threat-level", "int"), "cannot name an event attribute"),
        (EventAttributeSpec("level", "number"), "unknown type 'number'; use string, int"),
    ],
)
def test_a_bad_declaration_is_refused_by_field(spec, words):
    with pytest.raises(InvalidInput) as refused:
        declare_event_attributes(attributes=[spec], actor=OPERATOR)
    assert refused.value.field == f"attributes.{spec.name}"
    assert words in refused.value.message
