"""The reach report after more answers are exported: the latest row versions count."""

from __future__ import annotations

from broker.audit import Actor
from broker.models import Delivery
from broker.services.deliveries import acknowledge_delivery
from reports.jobs import reach
from tests.reports.incident import INCIDENT_MARKS, RECEIVED_ONLY
from tests.reports.test_reach import assert_matches_the_database

pytestmark = INCIDENT_MARKS


def test_answers_exported_later_replace_the_earlier_row_versions(worm_incident):
    # Everyone who confirmed having a delivery and never answered it answers now.
    received_only = Delivery.objects.filter(state="delivered").select_related("receiver")
    assert {d.receiver.name for d in received_only} >= set(RECEIVED_ONLY)
    for delivery in received_only:
        acknowledge_delivery(
            client=delivery.receiver,
            delivery_id=delivery.pk,
            status="ok",
            result={"done": True},
            actor=Actor("client", delivery.receiver.name),
        )

    data = worm_incident.export()
    result = reach.run(data, worm_incident.params)

    assert data.table("deliveries").count() == Delivery.objects.count()
    assert_matches_the_database(result, worm_incident.params)
    states = {row["state"] for row in result.sections["never_answered"]}
    assert "delivered" not in states  # everyone who had it has now answered
