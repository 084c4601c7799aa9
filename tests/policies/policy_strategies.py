"""Hypothesis strategies for random models, policies, selectors, filters and inputs.

The value pools are small and overlapping on purpose: random inputs then hit
boundaries (equal values, prefixes, versions written two ways, wrong types,
missing attributes) often enough for the properties to mean something.
"""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from policies import Constraint, Filter, Version
from policies.types import AttributeType

settings.register_profile(
    "policies-ci",
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "policies-dev",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Required properties run with 500 examples unless a developer asks for fewer.
PROPERTY = settings.get_profile(os.environ.get("POLICIES_HYPOTHESIS_PROFILE", "policies-ci"))

TYPES = list(AttributeType)
INTS = [-1, 0, 1, 2, 3, 10]
FLOATS = [-1.5, 0.0, 0.5, 1.0, 2.5, 7.25]
TEXTS = ["", "a", "ab", "abc", "b", "web-1", "web-2", "2.4", "2.4.0", "2.10"]
VERSIONS = ["1", "2.4", "2.4.0", "2.4.1", "2.10", "3"]
PATTERNS = ["a*", "*b", "*a*", "web-*", "2.4.*", "?b", "[ab]*", "a", "*", "", "2.*"]
OTHER_VALUES = [float("nan"), [1], Version("2.4")]

ALL_LITERALS = INTS + FLOATS + TEXTS + [True, False]
RUNTIME_VALUES = [*ALL_LITERALS, "02.4", "2.4.01", "web-10", *OTHER_VALUES]

_ORDERED_OPS = ["==", "!=", "<", "<=", ">", ">=", "in"]
_PRESENCE_OPS = ["exists", "not exists"]
_TEXT_OPS = ["~", "startswith", "endswith", "contains"]
OPS_BY_TYPE = {
    AttributeType.INT: [*_ORDERED_OPS, *_PRESENCE_OPS],
    AttributeType.FLOAT: [*_ORDERED_OPS, *_PRESENCE_OPS],
    AttributeType.BOOL: ["==", "!=", "in", *_PRESENCE_OPS],
    AttributeType.STRING: ["==", "!=", "<", ">=", "in", *_TEXT_OPS, *_PRESENCE_OPS],
    AttributeType.VERSION: [*_ORDERED_OPS, "~", "startswith", *_PRESENCE_OPS],
}
PATTERN_OPS = {"~", "startswith", "endswith", "contains"}
ORDERING = {"<", "<=", ">", ">="}


def literal_text(value: object) -> str:
    """A Python literal as policy-language text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


@st.composite
def models(draw, names: list[str]) -> dict[str, AttributeType]:
    """A random model over the given attribute names."""
    return {name: draw(st.sampled_from(TYPES)) for name in names}


def _typed_literals(kind: AttributeType) -> list[object]:
    return {
        AttributeType.INT: INTS,
        AttributeType.FLOAT: FLOATS + INTS,
        AttributeType.BOOL: [True, False],
        AttributeType.STRING: TEXTS,
        AttributeType.VERSION: VERSIONS,
    }[kind]


@st.composite
def constraint_texts(draw, name: str, kind: AttributeType | None) -> str:
    """One constraint as text; untyped (kind None) literals may be of any type."""
    op = draw(st.sampled_from(OPS_BY_TYPE[kind or draw(st.sampled_from(TYPES))]))
    if op in ("exists", "not exists"):
        return f"{name} {op}"
    if op in PATTERN_OPS:
        return f"{name} {op} {literal_text(draw(st.sampled_from(PATTERNS)))}"
    pool = _typed_literals(kind) if kind else ALL_LITERALS
    if op in ORDERING:
        pool = [value for value in pool if not isinstance(value, bool)]
    if op == "in":
        items = draw(st.lists(st.sampled_from(pool), max_size=3))
        return f"{name} in [{', '.join(literal_text(item) for item in items)}]"
    return f"{name} {op} {literal_text(draw(st.sampled_from(pool)))}"


@st.composite
def expression_texts(draw, names: list[str], model: dict | None, depth: int = 3) -> str:
    """A random expression over ``names`` (already scoped as they must be written)."""
    choice = draw(st.integers(0, 9 if depth > 0 else 0))
    if choice <= 4:
        name = draw(st.sampled_from(names))
        kind = model.get(_bare(name)) if model else None
        return draw(constraint_texts(name, kind))
    if choice == 5:
        return f"not ({draw(expression_texts(names, model, depth - 1))})"
    if choice == 6:
        return draw(st.sampled_from(["true", "false"]))
    joiner = " and " if choice in (7, 8) else " or "
    left = draw(expression_texts(names, model, depth - 1))
    right = draw(expression_texts(names, model, depth - 1))
    return f"({left}){joiner}({right})"


def _bare(name: str) -> str:
    return name.split(".")[-1]


SENDER_NAMES = ["organization", "trust", "region"]
EVENT_NAMES = ["kind", "level", "alert"]
RECEIVER_NAMES = ["software", "version", "load", "region", "cgi"]


@st.composite
def policy_cases(draw, depth: int = 3) -> tuple[str, dict | None, dict | None]:
    """(policy text, sender model, event model); models are None half of the time."""
    typed = draw(st.booleans())
    sender_model = draw(models(SENDER_NAMES)) if typed else None
    event_model = draw(models(EVENT_NAMES)) if typed else None
    scoped = [f"sender.{n}" for n in SENDER_NAMES] + [f"event.{n}" for n in EVENT_NAMES]
    merged = {**(sender_model or {}), **(event_model or {})} if typed else None
    # Sender and event names are distinct, so one merged model serves both.
    text = draw(expression_texts(scoped, merged, depth))
    return f"accept {text}", sender_model, event_model


@st.composite
def selector_cases(draw, depth: int = 3) -> tuple[str, dict | None]:
    """(selector text, receiver model or None)."""
    model = draw(models(RECEIVER_NAMES)) if draw(st.booleans()) else None
    names = RECEIVER_NAMES + [f"receiver.{n}" for n in RECEIVER_NAMES[:2]]
    return draw(expression_texts(names, model, depth)), model


@st.composite
def attribute_maps(draw, names: list[str], model: dict | None = None) -> dict[str, object]:
    """Attributes for an input: some missing, mostly well typed, sometimes odd."""
    result: dict[str, object] = {}
    for name in names:
        if draw(st.integers(0, 4)) == 0:
            continue
        kind = (model or {}).get(name)
        if kind is not None and draw(st.integers(0, 3)) > 0:
            pool = _typed_literals(kind) + (VERSIONS if kind == AttributeType.STRING else [])
        else:
            pool = RUNTIME_VALUES
        result[name] = draw(st.sampled_from(pool))
    return result


# ---------------------------------------------------------------------------
# Filters built directly (covering and coagulation work on any constraint).

FILTER_NAMES = ["x", "y"]


DOMAIN_POOLS: dict[str, list[object]] = {
    "number": INTS + FLOATS,
    "text": TEXTS,
    "version": [Version(v) for v in VERSIONS],
    "bool": [True, False],
}
ANY_POOL = [value for pool in DOMAIN_POOLS.values() for value in pool]


@st.composite
def constraints(draw, names: list[str] = FILTER_NAMES, domain: str | None = None) -> Constraint:
    """A receiver-scope constraint, maybe negated, with literals mostly from ``domain``.

    The first name is drawn most of the time so that constraints interact.
    """
    name = names[0] if draw(st.integers(0, 4)) else draw(st.sampled_from(names))
    op = draw(st.sampled_from(CONSTRAINT_OPS))
    if op in ("exists", "not exists"):
        return Constraint("receiver", name, op)
    if op in PATTERN_OPS:
        value: object = draw(st.sampled_from(PATTERNS + TEXTS))
    else:
        use_domain = domain is not None and draw(st.integers(0, 4)) > 0
        pool = DOMAIN_POOLS[domain] if use_domain else ANY_POOL
        if op in ORDERING:
            pool = [v for v in pool if not isinstance(v, bool)] or INTS
        value = draw(st.sampled_from(pool))
        if op == "in":
            value = tuple(draw(st.lists(st.sampled_from(pool), max_size=3)))
    return Constraint("receiver", name, op, value, draw(st.integers(0, 5)) == 0)


CONSTRAINT_OPS = [*_ORDERED_OPS, *_TEXT_OPS, *_PRESENCE_OPS]


@st.composite
def filters(draw, max_size: int = 3, domain: str | None = None) -> Filter:
    """A random conjunction of up to ``max_size`` constraints."""
    if domain is None:
        domain = draw(st.sampled_from([*DOMAIN_POOLS, None]))
    return Filter(frozenset(draw(st.lists(constraints(domain=domain), max_size=max_size))))


@st.composite
def filter_pairs(draw) -> tuple[Filter, Filter]:
    """(a, b) where a is often a variant of part of b: the hard covering cases."""
    domain = draw(st.sampled_from([*DOMAIN_POOLS, None]))
    b = draw(filters(domain=domain))
    if draw(st.integers(0, 3)) == 0 or not b.constraints:
        return draw(filters(domain=domain)), b
    kept = [c for c in b.sorted_constraints() if draw(st.booleans())]
    target = draw(st.sampled_from(b.sorted_constraints()))
    modified = draw(_variant(target, domain, force=True))
    return Filter(frozenset([*kept, modified])), b


@st.composite
def _variant(draw, constraint: Constraint, domain: str | None, force: bool) -> Constraint:
    """A near variant of a constraint: same attribute, related operator and literal."""
    choice = draw(st.integers(2 if force else 0, 3))
    if choice == 0 or constraint.op in ("exists", "not exists", "in"):
        return constraint
    if choice == 1:
        return draw(constraints(domain=domain))
    value = constraint.value
    if isinstance(value, str) and draw(st.booleans()):
        op = draw(st.sampled_from(["==", "~", "startswith", "endswith", "contains"]))
        value = draw(st.sampled_from([value, value[:-1], value[1:], value + "*", "*" + value]))
    else:
        op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
        if draw(st.booleans()):  # same literal, other operator: inclusivity edges
            value = draw(st.sampled_from(DOMAIN_POOLS.get(domain or "", [value]) or [value]))
        if isinstance(value, bool) and op not in ("==", "!="):
            op = "=="
    return Constraint(constraint.scope, constraint.name, op, value, constraint.negated)


@st.composite
def receiver_inputs(draw, names: list[str] = FILTER_NAMES) -> dict[str, object]:
    """Scopes for filter tests: ``{"receiver": {...}}``."""
    return {"receiver": draw(attribute_maps(names))}


def boundary_values(*filters_: Filter) -> list[object]:
    """Values at the edges of the filters' constraints: literals and their neighbours."""
    found: list[object] = []
    for f in filters_:
        for constraint in f.constraints:
            values = constraint.value if constraint.op == "in" else (constraint.value,)
            for value in values:
                found.extend(_neighbours(value))
    return found


def _neighbours(value: object) -> list[object]:
    if value is None:
        return []
    if isinstance(value, Version):
        return [value.text, value.text + ".0", "0" + value.text, value.text + ".1"]
    if isinstance(value, bool):
        return [value]
    if isinstance(value, int | float):
        return [value, value + 0.5, value - 0.5, float(value), int(value)]
    text = value.replace("*", "x").replace("?", "y").replace("[", "").replace("]", "")
    return [value, text, text + "z", "z" + text, text[:-1]]


@st.composite
def inputs_near(draw, *filters_: Filter, count: int = 20) -> list[dict[str, object]]:
    """Inputs for filter tests, mostly built from the filters' own boundary values."""
    pool = boundary_values(*filters_) + RUNTIME_VALUES
    scopes = []
    for _ in range(count):
        attributes = {}
        for name in FILTER_NAMES:
            if draw(st.integers(0, 5)):
                attributes[name] = draw(st.sampled_from(pool))
        scopes.append({"receiver": attributes})
    return scopes
