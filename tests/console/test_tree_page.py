"""The Dispatcher tree page: the topology with each dispatcher's figures, live."""

import json
import re

import pytest
from django.urls import reverse
from websockets.sync.client import connect

from broker.models import AuditEntry, Client, Delivery, Dispatcher, Event, TrafficRecord
from broker.services.events import publish_event
from demo.scenario import load_scenario
from tests.broker.tree_helpers import held_hops, release, wait_until_idle
from tests.cast import Member
from tests.console.conftest import logged_in
from tests.console.test_console_socket import logged_in_cookie, socket_url

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

NOBODY = Member("nora", "nora-has-no-role-42")
DISABLE_CGI = {"kind": "command", "action": "disable-cgi"}


@pytest.fixture
def routed(celery_worker):
    """The scenario with 12 servers, and a command routed through the real tree."""
    scenario = load_scenario(servers=12)
    wait_until_idle()  # every summary stored: the command is routed to every receiver
    publish_event(sender=scenario.controllers["intellimune-national"], content=DISABLE_CGI)
    wait_until_idle()
    return scenario


def rows(body: str) -> list[tuple[str, str]]:
    """(name, depth) of the page's dispatcher rows, in order."""
    return re.findall(r'<tr data-dispatcher="([^"]+)" data-depth="(\d)"', body)


def row_of(body: str, name: str) -> str:
    start = body.index(f'<tr data-dispatcher="{name}"')
    return body[start : body.index("</tr>", start)]


def test_the_page_shows_the_topology_root_first_with_children_nested(as_auditor, routed):
    body = as_auditor.get(reverse("tree")).content.decode()
    assert rows(body) == [
        ("d0", "0"), ("d0.0", "1"), ("d0.0.0", "2"), ("d0.0.1", "2"),
        ("d0.1", "1"), ("d0.1.0", "2"), ("d0.1.1", "2"),
    ]  # fmt: skip
    assert "depth-2" in row_of(body, "d0.1.0") and "leaf" in row_of(body, "d0.1.0")
    assert "root" in row_of(body, "d0")


def test_each_dispatcher_shows_its_clients_summary_inbox_and_traffic(as_operator, routed):
    body = as_operator.get(reverse("tree")).content.decode()
    for leaf in Dispatcher.objects.filter(is_leaf=True):
        attached = Client.objects.filter(dispatcher=leaf).count()
        assert f'data-clients="{attached}"' in row_of(body, leaf.name)
    root = row_of(body, "d0")
    assert f'data-clients="{Client.objects.count()}"' in root and "below" in root
    assert f'data-routed="{TrafficRecord.objects.filter(dispatcher__name="d0").count()}"' in root
    assert 'data-filters="2"' in root and 'data-constraints="7"' in root
    assert 'data-loss="0.0"' in root
    assert 'data-inbox="0"' in root
    delivered = sum(int(n) for n in re.findall(r'data-delivered="(\d+)"', body))
    assert delivered == Delivery.objects.count() > 0
    assert "flagged" not in body


def test_a_deep_inbox_is_highlighted(as_auditor, routed):
    leaf = Dispatcher.objects.get(name="d0.0.1")
    held = held_hops(leaf, Event.objects.get(), 600)
    try:
        body = as_auditor.get(reverse("tree")).content.decode()
    finally:
        release(leaf, held)
    row = row_of(body, "d0.0.1")
    assert 'class="flagged" data-flagged="inbox"' in row and "deep inbox" in row
    assert 'data-inbox="600"' in row and "1 to look at" in body


def test_htmx_gets_only_the_tree_body(as_auditor, routed):
    response = as_auditor.get(reverse("tree"), headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert len(rows(body)) == 7
    assert "<nav" not in body and 'data-live-topic="tree"' not in body


def test_the_full_page_watches_the_tree_topic_and_links_from_the_nav(as_auditor, routed):
    body = as_auditor.get(reverse("tree")).content.decode()
    assert 'id="tree-body" data-live-topic="tree"' in body
    assert f'<a href="{reverse("tree")}" aria-current="page">Tree</a>' in body


def test_a_user_without_a_role_is_refused_and_the_refusal_is_audited(client):
    response = logged_in(client, NOBODY).get(reverse("tree"))
    assert response.status_code == 403
    refusal = AuditEntry.objects.using("audit").get(action="tree.view")
    assert refusal.outcome == "refused" and refusal.actor == "user:nora"


def test_an_anonymous_visitor_is_sent_to_log_in(client):
    response = client.get(reverse("tree"))
    assert response.status_code == 302 and response.url.startswith(reverse("login"))


def test_without_a_tree_the_page_says_how_one_is_built(as_auditor):
    body = as_auditor.get(reverse("tree")).content.decode()
    assert "There is no dispatcher tree yet" in body and "load_scenario" in body


def test_a_drained_inbox_announces_the_tree_topic(asgi_server, celery_worker, client, operator):
    scenario = load_scenario(servers=4)
    wait_until_idle()
    headers = {"Cookie": logged_in_cookie(client, operator), "Origin": asgi_server}
    with connect(socket_url(asgi_server), additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "watch", "topics": ["tree"]}))
        assert json.loads(ws.recv(timeout=10)) == {"type": "watching", "topics": ["tree"]}
        national = scenario.controllers["intellimune-national"]
        publish_event(sender=national, content=DISABLE_CGI)
        assert json.loads(ws.recv(timeout=10)) == {"type": "changed", "topic": "tree"}
