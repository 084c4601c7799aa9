"""The Send page: act for a granted sender, preview both sides, confirm large sends."""

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from broker.audit import Actor
from broker.models import AuditEntry, Client, Event
from broker.protocol import AgentSelf
from broker.reads.directory import forget_directory
from broker.reads.search import receivers_chosen
from broker.roles import OPERATOR
from broker.services.policies import set_policy
from broker.services.presence import session_opened
from broker.services.sending import Draft, grant_sending, save_send_template
from broker.services.signing_keys import make_sender_key
from demo.scenario import OVERLOADED, VULNERABLE, WORM_ALERT
from tests.cast import OPERATOR as OLIVIA_MEMBER
from tests.cast import log_in_proved
from tests.module_data import copy_for_the_test, scenario_for_the_module

pytestmark = pytest.mark.django_db(databases=["default", "audit"])

ALERT_FIELDS = {
    "sender": "northwest-controller",
    "content_name": list(WORM_ALERT),
    "content_value": [str(value) for value in WORM_ALERT.values()],
    "selector": 'region == "Northwest"',
    "lifetime_s": "600",
    "channel": "alerts",
}
DISABLE_CGI = {
    "sender": "intellimune-national",
    "content_name": ["kind", "action"],
    "content_value": ["command", "disable-cgi"],
    "selector": VULNERABLE,
    "lifetime_s": "300",
    "channel": "commands",
}


def operators_send_as_every_controller(scenario) -> None:
    operators = Group.objects.get(name=OPERATOR.name)
    for name in ("northwest-controller", "intellimune-national", "rogue-controller"):
        grant_sending(client=scenario.controllers[name], holder=operators, actor=Actor("test", "t"))


loaded_scenario = scenario_for_the_module(servers=40, then=operators_send_as_every_controller)


@pytest.fixture
def scenario(loaded_scenario):
    return copy_for_the_test(loaded_scenario)


def northwest_servers(scenario) -> int:
    return sum(1 for server in scenario.servers if server.name and _region(server) == "Northwest")


def _region(server) -> str:
    return server.attribute_values.get(name="region").value


def test_the_page_offers_only_the_senders_the_operator_may_act_for(as_operator, scenario):
    body = as_operator.get(reverse("send")).content.decode()

    assert '<option value="northwest-controller"' in body
    assert '<option value="web-00001"' not in body


def test_a_template_fills_the_form(as_operator, scenario):
    body = as_operator.get(reverse("send"), {"template": "shutdown"}).content.decode()

    assert "shutdown" in body and "load &gt;= 0.8" in body and 'value="600"' in body


def test_the_worm_alert_template_fills_the_form_as_the_tour_says(as_operator, scenario):
    body = as_operator.get(reverse("send"), {"template": "worm-alert"}).content.decode()

    assert '<option value="northwest-controller" selected>' in body
    assert "region == &quot;Northwest&quot;" in body and 'value="alerts"' in body


def test_the_page_offers_the_sends_the_service_keeps_not_the_demos_code(as_operator, scenario):
    draft = Draft(
        sender=scenario.controllers["intellimune-national"],
        content={"kind": "command", "action": "status"},
        selector='region == "Southeast"',
        lifetime_s=90,
        channel="commands",
    )
    save_send_template(slug="southeast-status", title="Status of the Southeast", draft=draft,
                       actor=Actor("test", "t"))  # fmt: skip

    page = as_operator.get(reverse("send")).content.decode()
    filled = as_operator.get(reverse("send"), {"template": "southeast-status"}).content.decode()

    assert 'data-template="southeast-status">Status of the Southeast</a>' in page
    assert 'data-template="worm-alert">Worm alert to the Northwest</a>' in page
    assert "region == &quot;Southeast&quot;" in filled and 'value="90"' in filled


def test_an_unknown_template_leaves_the_form_empty(as_operator, scenario):
    body = as_operator.get(reverse("send"), {"template": "no-such-send"}).content.decode()

    assert "selected>" not in body and 'value="60"' in body


def test_the_northwest_alert_reaches_exactly_the_northwest_servers(as_operator, scenario):
    body = as_operator.post(reverse("send-preview"), ALERT_FIELDS).content.decode()

    expected = northwest_servers(scenario)
    assert f'data-addressed="{expected}" data-accepting="{expected}" data-refusing="0"' in body
    assert "<td>Northwest</td><td>10</td><td>10</td><td>0</td>" in body


def test_a_refusing_receiver_is_counted_in_its_region_and_model(as_operator, scenario):
    refusing = next(s for s in scenario.servers if _region(s) == "Northwest")
    set_policy(client=refusing, text='accept event.kind == "command"', actor=Actor("test", "t"))

    body = as_operator.post(reverse("send-preview"), ALERT_FIELDS).content.decode()

    refused = '<strong class="bad">1</strong>'
    assert f"<td>Northwest</td><td>10</td><td>9</td><td>{refused}</td>" in body
    assert f"<td>web-server</td><td>10</td><td>9</td><td>{refused}</td>" in body


def test_the_trust_one_controller_reaches_no_one_and_the_preview_says_why(as_operator, scenario):
    rogue = {**ALERT_FIELDS, "sender": "rogue-controller"}

    body = as_operator.post(reverse("send-preview"), rogue).content.decode()

    assert 'data-accepting="0"' in body and 'data-refusing="10"' in body
    assert "<code>sender.trust &gt;= 2</code>" in body
    assert "(sender.trust is 1)" in body
    assert "web-00000" in body  # an example refusing receiver, by name


def test_content_is_typed_by_the_declared_event_attributes(as_operator, scenario):
    wrong = {**ALERT_FIELDS, "content_value": ["alert", "worm", "high", "IIS", "2.4.*"]}

    response = as_operator.post(reverse("send-preview"), wrong)

    assert response.status_code == 400
    assert 'data-problem-field="content.threat_level"' in response.content.decode()


def test_a_bad_selector_says_line_and_column(as_operator, scenario):
    response = as_operator.post(reverse("send-preview"), {**ALERT_FIELDS, "selector": "region =="})

    body = response.content.decode()
    assert response.status_code == 400 and 'data-problem-field="selector"' in body
    assert "line 1, column" in body


def test_json_content_is_read_when_chosen_and_its_mistakes_are_located(as_operator, scenario):
    fields = {**ALERT_FIELDS, "content_mode": "json", "content_json": '{"kind": "alert",}'}

    response = as_operator.post(reverse("send-preview"), fields)

    assert response.status_code == 400
    assert "line 1, column 18" in response.content.decode()


def test_sending_as_a_sender_not_granted_is_refused_and_audited(as_operator, scenario):
    Group.objects.get(name=OPERATOR.name).groupobjectpermission_set.all().delete()

    response = as_operator.post(reverse("send-go"), ALERT_FIELDS)

    assert response.status_code == 403 and Event.objects.count() == 0
    refusal = AuditEntry.objects.using("audit").get(action="event.send", outcome="refused")
    assert refusal.actor == "user:olivia" and refusal.target == "client:northwest-controller"


def test_an_auditor_cannot_send(as_auditor, scenario):
    assert as_auditor.get(reverse("send")).status_code == 403
    assert as_auditor.post(reverse("send-go"), ALERT_FIELDS).status_code == 403
    assert Event.objects.count() == 0


def test_a_large_send_waits_for_the_typed_count(as_operator, scenario, settings):
    settings.SEND_CONFIRM_ABOVE = 5
    asked = as_operator.post(reverse("send-go"), ALERT_FIELDS)
    assert asked.status_code == 409 and 'data-confirm-count="10"' in asked.content.decode()

    wrong = as_operator.post(reverse("send-go"), {**ALERT_FIELDS, "confirm_count": "9"})
    assert wrong.status_code == 409 and Event.objects.count() == 0

    sent = as_operator.post(reverse("send-go"), {**ALERT_FIELDS, "confirm_count": "10"})
    event = Event.objects.get()
    assert sent.status_code == 302 and sent["Location"] == reverse("event", args=[event.pk])
    assert event.sent_by == "user:olivia" and event.sender.name == "northwest-controller"
    entry = AuditEntry.objects.get(action="event.send", outcome="done")
    assert entry.target == f"event:{event.pk}"
    assert entry.details["confirmed_by"] == "olivia" and entry.details["accepting"] == 10
    refused = AuditEntry.objects.using("audit").get(action="event.send", outcome="refused")
    assert "you typed 9" in refused.reason


def test_a_small_send_goes_at_once_and_htmx_is_redirected(as_operator, scenario):
    response = as_operator.post(reverse("send-go"), DISABLE_CGI, HTTP_HX_REQUEST="true")

    event = Event.objects.get()
    assert response.status_code == 200
    assert response["HX-Redirect"] == reverse("event", args=[event.pk])
    assert event.content == {"kind": "command", "action": "disable-cgi"}


def test_a_standing_command_previews_those_that_match_now(as_operator, scenario):
    shutdown = {**DISABLE_CGI, "selector": OVERLOADED, "content_value": ["command", "shutdown"]}

    body = as_operator.post(reverse("send-preview"), shutdown).content.decode()

    assert 'data-addressed="0"' in body and "No receiver has attributes" in body


def test_an_admin_lets_a_user_send_as_a_sender_and_it_is_audited(client, scenario):
    from tests.cast import ADMINISTRATOR, create_member

    create_member(OLIVIA_MEMBER)
    log_in_proved(client, create_member(ADMINISTRATOR))
    url = reverse("client-sending", args=["rogue-controller"])

    body = client.post(url, {"do": "grant", "holder": "user:olivia"}).content.decode()

    assert 'data-holder="user:olivia"' in body and 'data-holder="group:operator"' in body
    entry = AuditEntry.objects.get(action="client.grant_sending", actor="user:adam")
    assert entry.actor == "user:adam" and entry.details == {"holder": "user:olivia"}
    client.post(url, {"do": "withdraw", "holder": "user:olivia"})
    assert AuditEntry.objects.filter(action="client.withdraw_sending").count() == 1


def test_an_operator_cannot_decide_who_may_send(as_operator, scenario):
    url = reverse("client-sending", args=["rogue-controller"])

    response = as_operator.post(url, {"do": "grant", "holder": "user:olivia"})

    assert response.status_code == 403


def test_an_unknown_holder_is_a_clear_error(client, scenario):
    from tests.cast import ADMINISTRATOR, create_member

    log_in_proved(client, create_member(ADMINISTRATOR))
    url = reverse("client-sending", args=["rogue-controller"])

    response = client.post(url, {"do": "grant", "holder": "user:nobody"})

    assert response.status_code == 400 and "group:NAME or user:NAME" in response.content.decode()


def test_content_larger_than_the_limit_is_refused_before_any_receiver_gets_it(
    as_operator, scenario
):
    huge = {
        **DISABLE_CGI,
        "content_name": ["kind", "note"],
        "content_value": ["command", "x" * 70_000],
    }

    response = as_operator.post(reverse("send-go"), huge)

    assert response.status_code == 400 and "larger than 65536 bytes" in response.content.decode()
    assert Event.objects.count() == 0


def test_a_count_that_is_not_a_number_is_named_as_such(as_operator, scenario, settings):
    settings.SEND_CONFIRM_ABOVE = 5

    response = as_operator.post(reverse("send-go"), {**ALERT_FIELDS, "confirm_count": "ten"})

    assert (
        response.status_code == 409
        and "you typed something else" in response.content.decode().lower()
    )


def test_the_preview_says_whether_the_send_will_be_signed_and_the_event_page_shows_it(
    as_operator, scenario
):
    unsigned = as_operator.post(reverse("send-preview"), DISABLE_CGI).content.decode()
    make_sender_key(client=scenario.controllers["intellimune-national"], actor=Actor("test", "t"))
    signed = as_operator.post(reverse("send-preview"), DISABLE_CGI).content.decode()
    as_operator.post(reverse("send-go"), DISABLE_CGI)
    event = Event.objects.get()
    page = as_operator.get(reverse("event", args=[event.pk])).content.decode()

    assert 'data-signing="no key"' in unsigned and "goes <strong>unsigned</strong>" in unsigned
    assert 'data-signing="signed"' in signed
    assert event.seal["sender"] == "intellimune-national"
    assert 'data-signature="signed"' in page


def test_an_unsigned_send_is_previewed_with_how_many_of_its_receivers_verify_and_refuse_it(
    as_operator, scenario
):
    addressed = Client.objects.filter(pk__in=receivers_chosen(selector_text=VULNERABLE))
    for server, acts_on in zip(addressed.order_by("name")[:2], ("signed", "anything"), strict=True):
        agent = AgentSelf("sn-agent 0.2.0", acts_on)
        session_opened(client_id=server.pk, peer="192.0.2.1:5000", agent=agent)
    forget_directory()  # this process's directory was built before the logins

    body = as_operator.post(reverse("send-preview"), DISABLE_CGI).content.decode()

    assert 'data-signing="no key" data-verifying="1"' in body
    assert "1 verify signatures, 1 act on anything unsigned" in body
