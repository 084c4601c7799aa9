"""Fuzzing the HTTP API of a real Uvicorn from its own OpenAPI schema (schemathesis).

Each operation gets requests generated from the schema, valid ones and invalid ones,
with a valid bearer token of a kind the operation accepts. No answer may be a 5xx,
every answer's status and body must be declared in the schema, and a request that the
schema calls invalid must be refused. Derandomized and bounded, so that a run is
reproducible and short.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

# Imported at collection, not at the first from_url() call inside the test: pytest
# rewrites schemathesis's modules as it imports them, and CPython 3.11.7's parser once
# failed there ("AST constructor recursion depth mismatch", CPython gh-106905) with the
# other tests' threads running.
from schemathesis.specs.openapi import schemas as _openapi_schemas  # noqa: F401
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from broker.services.clients import issue_token
from broker.services.operators import issue_operator_token
from demo.scenario import load_scenario
from tests.broker.agent_helpers import ISSUER
from tests.broker.tree_helpers import wait_until_idle
from tests.cast import ADMINISTRATOR, create_member

pytestmark = pytest.mark.django_db(transaction=True)

CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
CHECKS = {
    GenerationMode.POSITIVE: CONFORMANCE,
    GenerationMode.NEGATIVE: [*CONFORMANCE, negative_data_rejection],
}
EXAMPLES_PER_OPERATION = 30
FUZZ = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)


@pytest.fixture
def bearer_tokens(celery_worker, operator) -> dict[str, list[str]]:
    """Valid tokens of each kind the schema names: a sending client, an operator without
    permissions and an administrator, and an authority."""
    scenario = load_scenario(servers=2)
    wait_until_idle()
    sender = scenario.controllers["intellimune-national"]
    return {
        "ClientToken": [issue_token(client=sender, actor=ISSUER)],
        "OperatorToken": [
            issue_operator_token(user=operator, label="fuzz", actor=ISSUER),
            issue_operator_token(user=create_member(ADMINISTRATOR), label="fuzz", actor=ISSUER),
        ],
        "AuthorityKey": [scenario.secrets["macrocorp-inventory"]],
    }


def tokens_for(operation, bearer_tokens: dict[str, list[str]]) -> list[str]:
    """Every valid token of a kind that `operation`'s security requirements accept."""
    requirements = operation.definition.raw.get("security", [])
    return [token for needed in requirements for name in needed for token in bearer_tokens[name]]


def fuzz_operation(operation, mode: GenerationMode, base_url: str, tokens: list[str]) -> None:
    @FUZZ
    @given(case=operation.as_strategy(generation_mode=mode), token=st.sampled_from(tokens))
    def one_request(case, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS[mode])

    one_request()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_the_schema_describes_gets_a_5xx_or_an_undeclared_answer(
    asgi_server, bearer_tokens, mode
):
    schema = schemathesis.openapi.from_url(asgi_server + "/api/v1/openapi.json")
    # Only the valid tokens given authenticate; unknown query parameters are ignored (as
    # is usual) rather than refused, so schemathesis should not count them as invalid.
    schema.config.generation.update(with_security_parameters=False, allow_extra_parameters=False)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 10  # every endpoint is fuzzed: a new one is counted here
    for operation in operations:
        fuzz_operation(operation, mode, asgi_server, tokens_for(operation, bearer_tokens))
    wait_until_idle()
