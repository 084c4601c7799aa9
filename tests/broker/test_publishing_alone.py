"""Publishing outside any transaction: one statement (the services' tests around it run
inside their module's transaction, tests/module_data.py)."""

import pytest
from django.db import connection

from broker.dispatch.consumer import StatementCounter
from broker.models import Event
from broker.services.events import publish_event
from demo.scenario import load_scenario


@pytest.mark.django_db(databases=["default", "audit"], transaction=True)
def test_publishing_outside_a_transaction_is_one_statement():
    scenario = load_scenario(servers=2)
    sender = scenario.controllers["northwest-controller"]
    publish_event(sender=sender, content={"alert": "worm"})  # the vocabulary is read
    statements = StatementCounter()
    with connection.execute_wrapper(statements):
        event = publish_event(sender=sender, content={"alert": "worm"})
    assert statements.count == 1
    assert Event.objects.get(pk=event.pk).sequence == 2
