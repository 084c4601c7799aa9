"""Attested values that expire: the leaves are told (broker.expire_attributes), so a
receiver stops getting the events selected by the value, through the real tree."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from broker.dispatch.state import LeafState
from broker.models import ClientChange, Delivery, Event
from broker.services.authorities import (
    announce_expirations_since_last_run,
    announce_expired_attestations,
    attest_attributes,
    revoke_attestation,
)
from broker.services.events import publish_event
from demo.scenario import load_scenario
from tests.broker.tree_helpers import wait_until_idle

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])

WORM_ALERT = {"kind": "alert", "alert": "worm", "threat_level": 4}
NORTHWEST = 'region == "Northwest"'
LIFETIME_S = 2


@pytest.fixture
def scenario(celery_worker):
    scenario = load_scenario(servers=4)
    wait_until_idle()
    return scenario


def attest_northwest_briefly(scenario):
    """web-00000 (in the Northwest) is attested there again, for LIFETIME_S only."""
    server = scenario.servers[0]
    expires_at = timezone.now() + timedelta(seconds=LIFETIME_S)
    attest_attributes(
        authority=scenario.inventory,
        client=server,
        grant_key=scenario.grants[(server.name, scenario.inventory.name)],
        values={"region": "Northwest"},
        expires_at=expires_at,
    )
    return server, expires_at


def wait_past(moment) -> None:
    time.sleep(max(0.0, (moment - timezone.now()).total_seconds()) + 0.1)


def alert_receivers(scenario) -> set[str]:
    event = publish_event(
        sender=scenario.controllers["northwest-controller"],
        content=WORM_ALERT,
        selector=NORTHWEST,
        lifetime_s=600,
    )
    wait_until_idle()
    return set(Delivery.objects.filter(event=event).values_list("receiver__name", flat=True))


def test_a_receiver_whose_attested_region_expired_stops_getting_alerts_for_it(scenario):
    server, expires_at = attest_northwest_briefly(scenario)
    wait_until_idle()
    assert alert_receivers(scenario) == {server.name}
    wait_past(expires_at)
    assert announce_expirations_since_last_run() >= 1
    wait_until_idle()
    assert alert_receivers(scenario) == set()
    assert Event.objects.count() == 2


def test_the_leaf_state_drops_the_expired_value_once_the_change_is_logged(scenario):
    server, expires_at = attest_northwest_briefly(scenario)
    state = LeafState(server.dispatcher_id)
    assert state.matcher.attributes(server.pk)["region"] == "Northwest"
    wait_past(expires_at)
    announce_expirations_since_last_run()
    assert server.pk in state.refresh()
    assert "region" not in state.matcher.attributes(server.pk)


def test_a_value_is_announced_once_its_expiry_falls_in_the_window_and_not_before(scenario):
    server, expires_at = attest_northwest_briefly(scenario)
    before = ClientChange.objects.filter(client=server).count()
    now = timezone.now()
    assert announce_expired_attestations(after=now - timedelta(hours=1), through=now) == 0
    later = expires_at + timedelta(seconds=1)
    assert announce_expired_attestations(after=expires_at, through=later) == 0  # (after, ...]
    assert announce_expired_attestations(after=now, through=later) == 1
    assert ClientChange.objects.filter(client=server).count() == before + 1


def test_a_revoked_value_is_not_announced_again_when_its_expiry_passes(scenario):
    server, expires_at = attest_northwest_briefly(scenario)
    revoke_attestation(authority=scenario.inventory, client=server, names=["region"])
    later = expires_at + timedelta(seconds=1)
    assert announce_expired_attestations(after=timezone.now(), through=later) == 0
