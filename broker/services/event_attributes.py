"""The event vocabulary: attributes of event content that policies may test.

A policy may only name `event.x` for a declared x, and published content must give a
declared attribute a value of its type (docs/addressing.md). A declared type never
changes: policies saved under it must keep their meaning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import transaction

from broker import audit
from broker.audit import Actor
from broker.errors import InvalidInput
from broker.models import EventAttribute, identifier
from broker.services.events import FORGED_NAMES
from policies import AttributeType

MAX_NAME_LENGTH = 64
TYPE_NAMES = [t.value for t in AttributeType]


@dataclass(frozen=True)
class EventAttributeSpec:
    """How one event attribute is declared."""

    name: str
    type: str
    description: str = ""


def declare_event_attributes(
    *, attributes: Iterable[EventAttributeSpec], actor: Actor
) -> list[EventAttribute]:
    """Declare event attributes, all or none. Declaring a name again with its type is
    harmless (its description is kept); with another type it is refused."""
    specs = list(attributes)
    with audit.refusals_recorded(
        actor=actor,
        action="event_attribute.declare",
        target="event-vocabulary",
        details={"attributes": {str(s.name)[:64]: str(s.type)[:16] for s in specs}},
    ):
        _check_specs(specs)
        with transaction.atomic():
            new = _new_names(specs)
            # A name declared concurrently is skipped here and its type compared below:
            # the unique name decides who declared it first, no lock needed.
            EventAttribute.objects.bulk_create(
                [EventAttribute(name=s.name, type=s.type, description=s.description) for s in new],
                ignore_conflicts=True,
            )
            declared = _refuse_other_types(specs)
            if new:
                audit.record_change(
                    actor=actor,
                    action="event_attribute.declare",
                    target="event-vocabulary",
                    details={"declared": {s.name: s.type for s in new}},
                )
    return declared


def _check_specs(specs: list[EventAttributeSpec]) -> None:
    if not specs:
        raise InvalidInput("declare at least one event attribute", field="attributes")
    seen = set()
    for spec in specs:
        _check_spec(spec)
        if spec.name in seen:
            raise InvalidInput(f"{spec.name} is declared twice", field=f"attributes.{spec.name}")
        seen.add(spec.name)


def _check_spec(spec: EventAttributeSpec) -> None:
    field = f"attributes.{spec.name}"
    if not isinstance(spec.name, str) or len(spec.name) > MAX_NAME_LENGTH:
        raise InvalidInput(f"a name is 1 to {MAX_NAME_LENGTH} characters", field=field)
    if not identifier.regex.match(spec.name) or spec.name in FORGED_NAMES:
        raise InvalidInput(
            f"{spec.name!r} cannot name an event attribute: use letters, digits and "
            f"underscores, starting with a letter, and none of {', '.join(sorted(FORGED_NAMES))}",
            field=field,
        )
    if spec.type not in TYPE_NAMES:
        known = ", ".join(TYPE_NAMES)
        raise InvalidInput(f"{spec.name} has unknown type {spec.type!r}; use {known}", field=field)


def _new_names(specs: list[EventAttributeSpec]) -> list[EventAttributeSpec]:
    names = [s.name for s in specs]
    existing = set(EventAttribute.objects.filter(name__in=names).values_list("name", flat=True))
    return [s for s in specs if s.name not in existing]


def _refuse_other_types(specs: list[EventAttributeSpec]) -> list[EventAttribute]:
    declared = {a.name: a for a in EventAttribute.objects.filter(name__in=[s.name for s in specs])}
    for spec in specs:
        if declared[spec.name].type != spec.type:
            raise InvalidInput(
                f"event attribute {spec.name} is declared as {declared[spec.name].type}; a "
                "declared type never changes (saved policies rely on it): use another name",
                field=f"attributes.{spec.name}",
            )
    return [declared[s.name] for s in specs]
