"""`manage.py generate_traffic` run by the tests themselves: twice in a row, with its
options, and refusing bad arguments (the incident's contents are checked in
test_synthetic_traffic.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.utils import timezone

from broker.models import AuditEntry, Delivery, Event, ReceiverStream
from demo.scenario import bulk_add_web_servers, load_scenario
from tests.demo.test_synthetic_traffic import generate, rows

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "audit"])


@pytest.fixture
def scenario():
    """The scenario without servers: the generator adds them by COPY."""
    load_scenario(servers=0)


def test_positions_continue_each_receivers_stream_and_the_streams_say_so():
    # Checked after two runs: the second continues where the first stopped.
    load_scenario(servers=0)
    generate("--servers", "120", "--deliveries", "2000", "--controllers", "4")
    generate("--servers", "120", "--deliveries", "2000", "--controllers", "4", "--seed", "9")

    gaps = rows("""
        SELECT d.receiver_id, count(*), min(d.position), max(d.position), s.last_position
        FROM broker_delivery d JOIN broker_receiverstream s ON s.client_id = d.receiver_id
        GROUP BY d.receiver_id, s.last_position
        HAVING count(*) <> max(d.position) OR min(d.position) <> 1
            OR max(d.position) <> s.last_position
    """)  # fmt: skip
    assert gaps == []
    assert ReceiverStream.objects.count() == Delivery.objects.values("receiver").distinct().count()
    assert 4_000 <= Delivery.objects.count() <= 4_000 * 1.05


def test_answers_go_unaudited_when_asked(scenario):
    generate("--servers", "60", "--deliveries", "500", "--controllers", "0", "--no-ack-audit")

    assert Delivery.objects.filter(state="acked").exists()
    assert not AuditEntry.objects.filter(action="delivery.ack").exists()


def test_the_demo_is_loaded_once(scenario):
    bulk_add_web_servers(40)

    said = generate("--demo")
    count = Delivery.objects.count()
    again = generate("--demo")

    assert 300 <= count <= 420
    assert "Wrote" in said and "nothing to do" in again
    assert Delivery.objects.count() == count
    assert AuditEntry.objects.filter(action="traffic.generate").count() == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--deliveries", "0"], "--deliveries must be between 1"),
        (["--servers", "-5"], "--servers must be between 1"),
        (["--controllers", "100000"], "--controllers must be between 0"),
        (["--start", "yesterday"], "--start must be an ISO 8601"),
        (["--start", (timezone.now() + timedelta(days=1)).isoformat()], "minutes ago"),
        (["--demo", "--deliveries", "10"], "--demo makes a small incident of its own"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(arguments, message):
    with pytest.raises(CommandError, match=message):
        generate(*arguments)
    assert not Event.objects.exists()
