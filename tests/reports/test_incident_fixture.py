"""The incident fixture is what it says: the export holds what the database holds."""

from collections import Counter

from broker.models import AuditEntry, Delivery, Event
from tests.reports.incident import READING_MARKS, SILENT

pytestmark = READING_MARKS


def test_the_incident_export_holds_every_event_and_delivery_in_its_final_state(incident):
    data = incident.data
    assert data.table("events").count() == Event.objects.count() == 5
    by_state = data.table("deliveries").groupBy("state").count().collect()
    states = {row["state"]: row["count"] for row in by_state}
    expected = Counter(Delivery.objects.values_list("state", flat=True))
    assert states == expected
    assert set(expected) == {"acked", "failed", "delivered", "pending", "expired"}
    expired = Delivery.objects.filter(state="expired").values_list("receiver__name", flat=True)
    assert sorted(expired) == sorted(SILENT)
    assert data.table("audit").count() == AuditEntry.objects.count()
