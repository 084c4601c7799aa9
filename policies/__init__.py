"""The policy language and matching: pure Python, never imports Django.

Public API (later issues script against these names):

* ``parse_policy`` / ``parse_selector`` -> ``Policy`` / ``Selector``
* ``PolicySyntaxError`` / ``PolicyTypeError`` with ``.line`` and ``.column``
* ``Filter``, ``covers``, ``coagulate``, ``over_acceptance``
* ``Matcher``: indexed symmetric matching of events to receivers
"""

from policies.coagulation import OverAcceptance, coagulate, over_acceptance
from policies.covering import covers, covers_all
from policies.errors import PolicySyntaxError, PolicyTypeError
from policies.expressions import Constraint
from policies.filters import Filter, filters_text, policy_text, to_filters
from policies.matcher import Explanation, Matcher
from policies.parser import parse_policy, parse_selector
from policies.rules import Policy, Selector, policy_from_filters, selector_from_filters
from policies.types import AttributeType, Version

__all__ = [
    "AttributeType",
    "Constraint",
    "Explanation",
    "Filter",
    "Matcher",
    "OverAcceptance",
    "Policy",
    "PolicySyntaxError",
    "PolicyTypeError",
    "Selector",
    "Version",
    "coagulate",
    "covers",
    "covers_all",
    "filters_text",
    "over_acceptance",
    "parse_policy",
    "parse_selector",
    "policy_from_filters",
    "policy_text",
    "selector_from_filters",
    "to_filters",
]
