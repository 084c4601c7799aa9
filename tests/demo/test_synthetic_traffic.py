"""`manage.py generate_traffic` writes an incident the service could have written:
every counter, reference, path and timestamp agrees with the rest, at the size asked,
again and again without collision, with refusals, policy and trust changes audited."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from auditchain.verification import entry_findings
from broker.audit import REFUSAL_CATEGORIES
from broker.dispatch.delivery import REFUSAL_REASONS
from broker.models import (
    AttributeHistory,
    AuditEntry,
    ChannelCursor,
    Client,
    Delivery,
    Dispatcher,
    Event,
    PolicyVersion,
    TrafficRecord,
)
from demo.scenario import load_scenario
from demo.synthetic.incident import LAST_HALF_HOUR
from demo.synthetic.policies import QUARANTINE

# The tests only read the incident, written once for the module (committed: the
# generator writes from threads of its own) and emptied after it.
pytestmark = pytest.mark.django_db(databases=["default", "audit"])

SERVERS = 300
DELIVERIES = 5_000


def generate(*arguments: str) -> str:
    output = io.StringIO()
    call_command("generate_traffic", *arguments, stdout=output)
    return output.getvalue()


@pytest.fixture(scope="module")
def incident(django_db_setup, django_db_blocker) -> Iterator[str]:
    """What the generator said, writing the incident over the scenario without servers
    (it adds them by COPY)."""
    with django_db_blocker.unblock():
        try:
            load_scenario(servers=0)
            yield generate(
                "--servers", str(SERVERS), "--deliveries", str(DELIVERIES),
                "--controllers", "8", "--seed", "3",
            )  # fmt: skip
        finally:
            call_command("flush", interactive=False, verbosity=0, database="default")


def rows(sql: str, parameters=()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, parameters)
        return cursor.fetchall()


def test_the_size_asked_is_met_within_two_percent_and_said(incident):
    count = Delivery.objects.count()

    assert DELIVERIES <= count <= DELIVERIES * 1.02
    assert f"{count:,} deliveries" in incident
    assert Client.objects.filter(name__startswith="web-").count() == SERVERS


def test_confirmed_positions_cover_exactly_the_received_prefix(incident):
    wrong = rows("""
        SELECT s.client_id FROM broker_receiverstream s
        JOIN broker_delivery d ON d.receiver_id = s.client_id
        GROUP BY s.client_id, s.confirmed_position
        HAVING s.confirmed_position
            <> coalesce(max(d.position) FILTER (WHERE d.received_at IS NOT NULL), 0)
            OR bool_or(d.received_at IS NULL AND d.position <= s.confirmed_position)
    """)  # fmt: skip
    assert wrong == []


def test_sequences_follow_each_channel_and_the_cursors_say_so(incident):
    cursors = {(c.sender_id, c.channel): c.last_sequence for c in ChannelCursor.objects.all()}
    streams = rows("""
        SELECT sender_id, channel, count(*), min(sequence), max(sequence) FROM broker_event
        GROUP BY sender_id, channel
    """)  # fmt: skip

    for sender, channel, count, first, last in streams:
        assert (first, last) == (1, count)
        assert cursors[(sender, channel)] == last
    # Later events of a channel carry later sequences.
    out_of_order = rows("""
        SELECT 1 FROM broker_event a JOIN broker_event b
          ON a.sender_id = b.sender_id AND a.channel = b.channel AND a.sequence < b.sequence
        WHERE a.published_at > b.published_at LIMIT 1
    """)  # fmt: skip
    assert out_of_order == []


def test_every_delivery_agrees_with_its_event_and_refers_to_real_rows(incident):
    disagreeing = rows("""
        SELECT d.id FROM broker_delivery d LEFT JOIN broker_event e ON e.id = d.event_id
        LEFT JOIN broker_client r ON r.id = d.receiver_id
        WHERE e.id IS NULL OR r.id IS NULL OR d.sender_id <> e.sender_id
           OR d.channel <> e.channel OR d.sequence <> e.sequence OR NOT r.can_receive
    """)  # fmt: skip
    assert disagreeing == []
    # A resend reaches only its recipients, after the event it resends.
    resends = Event.objects.filter(resend_of__isnull=False).select_related("resend_of")
    assert resends.exists()
    for resend in resends:
        received = set(resend.deliveries.values_list("receiver_id", flat=True))
        assert received <= set(resend.recipients)
        assert resend.published_at > resend.resend_of.expires_at
        assert resend.sent_by == "user:olivia"


def test_hops_climb_from_the_senders_leaf_and_go_down_where_forwarded(incident):
    parents = dict(Dispatcher.objects.values_list("id", "parent_id"))
    for event in Event.objects.select_related("sender"):
        hops = list(event.hops.order_by("at", "id"))
        up = [hop.dispatcher_id for hop in hops if hop.direction == "up"]
        path = [event.sender.dispatcher_id]
        while parents[path[-1]] is not None:
            path.append(parents[path[-1]])
        assert up == path
        at = {hop.dispatcher_id: hop.at for hop in hops}
        forwarded = {(hop.dispatcher_id, child) for hop in hops for child in hop.forwarded_to}
        for hop in hops:
            if hop.direction == "down":
                assert (parents[hop.dispatcher_id], hop.dispatcher_id) in forwarded
                assert hop.at > at[parents[hop.dispatcher_id]]
        assert {child for _, child in forwarded} == {
            hop.dispatcher_id for hop in hops if hop.direction == "down"
        }
        assert event.routed_at == at[path[-1]]


def test_each_leaf_hop_counts_the_deliveries_it_made_and_wasted_hops_made_none(incident):
    mismatched = rows("""
        WITH made AS (
            SELECT d.event_id, r.dispatcher_id, count(*) AS n FROM broker_delivery d
            JOIN broker_client r ON r.id = d.receiver_id GROUP BY 1, 2
        ), counted AS (
            SELECT event_id, dispatcher_id, sum(delivered) AS n FROM broker_trafficrecord
            GROUP BY 1, 2
        )
        SELECT * FROM made FULL JOIN counted USING (event_id, dispatcher_id)
        WHERE coalesce(made.n, 0) <> coalesce(counted.n, 0)
    """)  # fmt: skip
    assert mismatched == []
    wasted = TrafficRecord.objects.filter(wasted=1)
    assert wasted.exists()
    made = wasted.values_list("direction", "delivered", "forwarded_to")
    assert all(hop == ("down", 0, []) for hop in made)


def test_states_and_timestamps_are_in_order(incident):
    now = timezone.now()
    for delivery in Delivery.objects.select_related("event"):
        state, event = delivery.state, delivery.event
        assert event.published_at < delivery.delivered_at <= now
        if state in ("pending", "expired"):
            assert (delivery.received_at, delivery.acked_at, delivery.result) == (None, None, None)
            assert (event.expires_at > now) == (state == "pending")
            continue
        assert delivery.delivered_at <= delivery.received_at <= now
        if state == "delivered":
            assert delivery.acked_at is None
        else:
            assert delivery.received_at <= delivery.acked_at <= now
            assert ("error" in delivery.result) == (state == "failed")
    states = set(Delivery.objects.values_list("state", flat=True))
    assert {"acked", "failed", "delivered", "expired"} <= states


REGIONS_PACE = """
    SELECT v.value #>> '{}',
           percentile_cont(0.5) WITHIN GROUP (
               ORDER BY extract(epoch FROM d.received_at - d.delivered_at)),
           avg((d.state IN ('expired', 'pending'))::int)
    FROM broker_delivery d
    JOIN broker_attributevalue v ON v.client_id = d.receiver_id AND v.name = 'region'
    GROUP BY 1
"""


def test_one_region_is_slower_and_more_silent_than_the_others(incident):
    confirm, silent = {}, {}
    for region, median_s, share in rows(REGIONS_PACE):
        confirm[region], silent[region] = median_s, share

    for region in ("Northwest", "Northeast", "Southwest"):
        assert confirm["Southeast"] > 2 * confirm[region]
        assert silent["Southeast"] > silent[region]


def test_every_answer_is_audited_once_as_the_service_audits_it(incident):
    answered = Delivery.objects.filter(state__in=["acked", "failed"])
    entries = AuditEntry.objects.filter(action="delivery.ack")

    assert entries.count() == answered.count()
    delivery = answered.select_related("receiver").first()
    entry = entries.get(details__delivery=delivery.pk)
    assert (entry.actor, entry.target, entry.at) == (
        f"client:{delivery.receiver.name}",
        f"event:{delivery.event_id}",
        delivery.acked_at,
    )
    assert entry.details == {"delivery": delivery.pk, "state": delivery.state}


def test_every_entry_written_carries_an_authentication_code_that_holds(incident):
    assert AuditEntry.objects.count() > 1000
    assert list(entry_findings()) == []


def test_every_refusal_says_its_category_as_the_service_does(incident):
    refusals = AuditEntry.objects.filter(outcome="refused")
    categories = set(refusals.values_list("details__category", flat=True))

    assert categories == set(REFUSAL_CATEGORIES)
    leaves = refusals.filter(action="event.refused_by_policy", details__has_key="leaf")
    for entry in leaves[:50]:
        count, category = entry.details["refusers"], entry.details["category"]
        assert entry.reason.endswith(REFUSAL_REASONS[category])
        listed = entry.details["receivers"]
        assert len(listed["names"]) + listed["unlisted"] == count
    # Filtered content: from senders some branch of the servers' policy admits.
    for entry in leaves.filter(details__category="content_filtered")[:20]:
        sender = Event.objects.get(pk=entry.target.removeprefix("event:")).sender_attributes
        national = sender["organization"] == "Intellimune" and sender["scope"] == "national"
        assert national or (sender["region"] == "Northwest" and sender["trust"] >= 2)


def test_the_rogue_controllers_refusals_jump_in_the_last_half_hour(incident):
    refused = AuditEntry.objects.filter(
        action="event.refused_by_policy", actor="client:rogue-controller"
    )
    last = max(Event.objects.values_list("published_at", flat=True))
    since = last - timedelta(microseconds=LAST_HALF_HOUR)
    first = min(Event.objects.values_list("published_at", flat=True))
    half_hours_before = (since - first) / timedelta(microseconds=LAST_HALF_HOUR)

    recent = refused.filter(at__gte=since).count()
    before = refused.filter(at__lt=since).count()

    assert recent >= 6
    assert recent > 3 * before / half_hours_before


def test_the_quarantined_servers_refuse_every_sender_throughout(incident):
    selection, text = QUARANTINE
    quarantine = AuditEntry.objects.get(action="policy.set", details__selection=selection)
    names = quarantine.details["clients"]["names"]
    assert names and quarantine.actor == "user:paula"
    assert quarantine.at < Event.objects.order_by("published_at").first().published_at

    assert not Delivery.objects.filter(receiver__name__in=names).exists()
    refused = AuditEntry.objects.filter(action="event.refused_by_policy", details__has_key="leaf")
    listed = {name for entry in refused for name in entry.details["receivers"]["names"]}
    assert set(names) <= listed
    for client in Client.objects.filter(name__in=names):
        assert client.policy_versions.order_by("version").last().text == text


def test_trust_changes_are_written_as_values_their_history_and_the_audit(incident):
    changed = AuditEntry.objects.get(
        action="attributes.attest", actor="user:trevor", details__values={"trust": 1}
    )
    name = changed.details["clients"]["names"][0]
    client = Client.objects.get(name=name)
    history = list(
        AttributeHistory.objects.filter(client=client, name="trust")
        .order_by("at")
        .values_list("kind", "value")
    )
    # Attested at registration (COPY), lowered and restored (UPDATE): the trigger saw all.
    assert history == [("set", 3 if name.endswith("-1") else 2), ("set", 1), ("set", history[0][1])]
    revoked = AuditEntry.objects.get(action="attributes.revoke")
    regions = AttributeHistory.objects.filter(
        client__name=revoked.target.removeprefix("client:"), name="region"
    )
    assert list(regions.order_by("at").values_list("kind", flat=True)) == ["set", "revoked", "set"]
    restored = AuditEntry.objects.filter(action="attributes.attest", actor="user:trevor").exclude(
        pk=changed.pk
    )
    restored_at = restored.get().at
    for event in Event.objects.filter(sender=client):
        lowered = changed.at <= event.published_at < restored_at
        assert (event.sender_attributes["trust"] == 1) == lowered


def test_operator_sends_are_audited_with_their_reach(incident):
    sent = Event.objects.filter(sent_by="user:olivia")
    assert sent.exists()
    for event in sent[:10]:
        entry = AuditEntry.objects.get(action="event.send", target=f"event:{event.pk}")
        assert entry.details["accepting"] == event.deliveries.count()
        assert entry.details["as"] == event.sender.name


def test_new_policy_versions_continue_each_receivers_numbering(incident):
    broken = rows("""
        SELECT client_id FROM broker_policyversion GROUP BY client_id
        HAVING count(*) <> max(version) OR min(version) <> 1
    """)  # fmt: skip
    assert broken == []
    assert PolicyVersion.objects.filter(created_by="user:paula").exists()
