"""Clients: credentials, self-stated attributes, and what they may not state."""

import pytest

from broker.audit import Actor
from broker.errors import AuthenticationFailed, InvalidInput, NotAuthorised
from broker.models import AttributeHistory, AuditEntry, ClientChange, ClientModel, ClientToken
from broker.reads.clients import current_attributes
from broker.services.clients import (
    AttributeSpec,
    StatedValues,
    authenticate_client,
    authenticate_clients,
    create_client_model,
    issue_token,
    log_in_client,
    register_client,
    revoke_tokens,
    set_clients_active,
    state_attributes,
    state_attributes_of_clients,
)
from demo.scenario import WEB_SERVER_ATTRIBUTES

pytestmark = pytest.mark.django_db(databases=["default", "audit"])
OPERATOR = Actor("user", "olivia")


@pytest.fixture
def web_model():
    return create_client_model(name="web-server", attributes=WEB_SERVER_ATTRIBUTES, actor=OPERATOR)


@pytest.fixture
def server(web_model):
    client, _ = register_client(
        name="web-1", model=web_model, can_send=False, can_receive=True, actor=OPERATOR
    )
    return client


def test_registration_returns_a_secret_once_and_stores_only_its_hash(web_model):
    client, secret = register_client(
        name="web-9", model=web_model, can_send=False, can_receive=True, actor=OPERATOR
    )
    assert secret.startswith("sns_") and secret not in client.secret_hash
    assert client.dispatcher.is_leaf


def test_clients_are_spread_evenly_over_the_leaves(web_model):
    leaves = [
        register_client(
            name=f"w{i}", model=web_model, can_send=False, can_receive=True, actor=OPERATOR
        )[0].dispatcher_id
        for i in range(8)
    ]
    assert sorted(leaves.count(leaf) for leaf in set(leaves)) == [2, 2, 2, 2]


@pytest.mark.parametrize("name", ["", "a/b", "web\n", "-web", "..", "w" * 129, "web 1"])
def test_a_name_outside_the_client_name_rule_is_refused_by_field(web_model, name):
    with pytest.raises(InvalidInput) as refused:
        register_client(
            name=name, model=web_model, can_send=False, can_receive=True, actor=OPERATOR
        )
    assert refused.value.field == "name"


def test_names_of_letters_digits_dashes_underscores_and_dots_are_accepted(web_model):
    for name in ["w", "web.example.org", "Web_01-b", "9" * 128]:
        register_client(
            name=name, model=web_model, can_send=False, can_receive=True, actor=OPERATOR
        )


def test_a_duplicate_name_is_refused_by_field(server, web_model):
    with pytest.raises(InvalidInput) as refused:
        register_client(
            name="web-1", model=web_model, can_send=False, can_receive=True, actor=OPERATOR
        )
    assert refused.value.field == "name"


def test_login_gives_a_token_that_authenticates_until_revoked(server, web_model):
    client, secret = register_client(
        name="web-2", model=web_model, can_send=False, can_receive=True, actor=OPERATOR
    )
    token = log_in_client(name="web-2", secret=secret)
    assert authenticate_client(token) == client
    revoke_tokens(client=client, actor=OPERATOR)
    with pytest.raises(AuthenticationFailed):
        authenticate_client(token)


def test_authenticating_gives_the_client_with_its_model_and_marks_the_token_used(
    server, web_model, django_assert_num_queries
):
    token = issue_token(client=server, actor=OPERATOR)
    with django_assert_num_queries(1):  # one statement, the model included
        client = authenticate_client(token)
        assert (client.name, client.model.name, client.can_receive) == ("web-1", "web-server", True)
    assert client == server and client.model == web_model
    assert ClientToken.objects.get(client=server).last_used_at is not None


def test_many_tokens_are_checked_in_one_statement_each_answered_in_its_place(
    server, web_model, django_assert_num_queries
):
    other, _ = register_client(
        name="web-2", model=web_model, can_send=False, can_receive=True, actor=OPERATOR
    )
    revoked = issue_token(client=other, actor=OPERATOR)
    revoke_tokens(client=other, actor=OPERATOR)
    tokens = [issue_token(client=server, actor=OPERATOR), "junk", revoked]
    tokens.append(issue_token(client=other, actor=OPERATOR))
    with django_assert_num_queries(1):
        found = authenticate_clients(tokens)
    assert [client and client.name for client in found] == ["web-1", None, None, "web-2"]
    assert found[3].model == web_model


def test_a_token_of_a_deactivated_client_authenticates_nothing_and_is_not_marked_used(server):
    token = issue_token(client=server, actor=OPERATOR)
    set_clients_active(clients=[server], active=False, actor=OPERATOR)
    with pytest.raises(AuthenticationFailed):
        authenticate_client(token)
    assert ClientToken.objects.get(client=server).last_used_at is None


def test_a_wrong_secret_is_refused_and_audited(server):
    with pytest.raises(AuthenticationFailed):
        log_in_client(name="web-1", secret="guess")
    entry = AuditEntry.objects.using("audit").get(action="client.login")
    assert entry.outcome == "refused" and entry.actor == "client:web-1"


def test_a_client_states_its_own_attributes(server):
    state_attributes(client=server, values={"software": "IIS", "load": 0.4}, actor=OPERATOR)
    assert current_attributes(server) == {"software": "IIS", "load": 0.4}


def test_stating_the_same_values_again_writes_nothing(server):
    """As every agent does at every login: no history row, no audit entry, no change
    for the tree to route."""
    values = {"software": "IIS", "load": 0.4, "cgi": True}
    state_attributes(client=server, values=values, actor=OPERATOR)
    written = rows_written()
    state_attributes(client=server, values=dict(values), actor=OPERATOR)
    assert rows_written() == written


def rows_written() -> tuple[int, int, int]:
    models = (AttributeHistory, AuditEntry, ClientChange)
    return tuple(model.objects.count() for model in models)


@pytest.mark.parametrize("changed", [{"load": 0.5}, {"software": "Apache"}, {"cgi": False}])
def test_a_value_that_changed_is_written(server, changed):
    stated = {"software": "IIS", "load": 1, "cgi": True}
    state_attributes(client=server, values=stated, actor=OPERATOR)
    before = AuditEntry.objects.count()
    state_attributes(client=server, values={**stated, **changed}, actor=OPERATOR)
    assert AuditEntry.objects.count() == before + 1
    assert current_attributes(server) == {**stated, **changed}


def test_claiming_a_reserved_attribute_refuses_everything_and_is_audited(server):
    state_attributes(client=server, values={"software": "IIS"}, actor=Actor("client", "web-1"))
    with pytest.raises(NotAuthorised) as refused:
        state_attributes(
            client=server,
            values={"software": "nginx", "region": "Northwest"},
            actor=Actor("client", "web-1"),
        )
    assert refused.value.field == "region"
    assert "only be set by an authority" in refused.value.message
    assert current_attributes(server) == {"software": "IIS"}  # nothing applied half-way
    entry = AuditEntry.objects.using("audit").get(action="attributes.state", outcome="refused")
    assert entry.details["attempted"] == {"software": "nginx", "region": "Northwest"}


def test_many_clients_state_at_once_and_each_refusal_is_its_own(web_model, server):
    others = [
        register_client(
            name=f"web-{n}", model=web_model, can_send=False, can_receive=True, actor=OPERATOR
        )[0]
        for n in (2, 3, 4)
    ]
    state_attributes(client=others[2], values={"load": 0.1}, actor=OPERATOR)
    written = rows_written()
    outcomes = state_attributes_of_clients(
        [
            StatedValues(server, {"load": 0.4, "software": "IIS"}, Actor("client", "web-1")),
            StatedValues(others[0], {"load": 0.5, "region": "X"}, Actor("client", "web-2")),
            StatedValues(others[1], {"load": "high"}, Actor("client", "web-3")),
            StatedValues(others[2], {"load": 0.1}, Actor("client", "web-4")),  # as it is
        ]
    )
    assert outcomes[0] is None and outcomes[3] is None
    assert isinstance(outcomes[1], NotAuthorised) and outcomes[1].field == "region"
    assert isinstance(outcomes[2], InvalidInput) and outcomes[2].field == "load"
    assert current_attributes(server) == {"load": 0.4, "software": "IIS"}
    assert [current_attributes(c) for c in others] == [{}, {}, {"load": 0.1}]
    history, audit_entries, changes = (a - b for a, b in zip(rows_written(), written, strict=True))
    assert (history, audit_entries, changes) == (2, 1, 1)  # web-1's two values, one entry
    entry = AuditEntry.objects.filter(action="attributes.state").latest("pk")
    assert entry.actor == "client:web-1" and entry.details == {
        "values": {"load": 0.4, "software": "IIS"}
    }
    refused = AuditEntry.objects.using("audit").filter(outcome="refused")
    assert sorted(refused.values_list("target", flat=True)) == ["client:web-2", "client:web-3"]


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"load": "high"}, "load", "load must be a number"),
        ({"cgi": 1}, "cgi", "cgi must be true or false"),
        ({"version": "two"}, "version", "dotted version"),
        ({"colour": "blue"}, "colour", "not an attribute of this model"),
    ],
)
def test_values_that_do_not_fit_the_model_are_refused_by_field(server, values, field, message):
    with pytest.raises(InvalidInput) as refused:
        state_attributes(client=server, values=values, actor=OPERATOR)
    assert refused.value.field == field
    assert message in refused.value.message


@pytest.mark.django_db(transaction=True, databases=["default", "audit"])
def test_a_refusal_stays_in_the_audit_log_when_the_callers_transaction_rolls_back(server):
    from django.db import transaction

    with pytest.raises(NotAuthorised), transaction.atomic():
        state_attributes(client=server, values={"software": "IIS", "region": "X"}, actor=OPERATOR)
    refused = AuditEntry.objects.filter(action="attributes.state", outcome="refused")
    assert refused.count() == 1


def test_a_model_giving_a_known_name_another_type_is_refused_naming_the_other_model(web_model):
    with pytest.raises(InvalidInput) as refused:
        create_client_model(
            name="probe",
            attributes=[AttributeSpec("hostname", "string"), AttributeSpec("load", "string")],
            actor=OPERATOR,
        )
    assert refused.value.field == "load"
    assert refused.value.message.startswith(
        "load is already declared as float by model 'web-server'; a name has one type"
    )
    assert not ClientModel.objects.filter(name="probe").exists()
    refusal = AuditEntry.objects.using("audit").get(action="model.create", outcome="refused")
    assert refusal.target == "model:probe" and refusal.details["field"] == "load"


def test_models_may_share_a_name_of_the_same_type(web_model):
    probe = create_client_model(
        name="probe", attributes=[AttributeSpec("load", "float")], actor=OPERATOR
    )
    assert list(probe.attributes.values_list("name", "type")) == [("load", "float")]
