"""The console's directory of clients, per process, kept fresh from the change log."""

from dataclasses import replace

import pytest

from broker.models import (
    AttestationGrant,
    AttributeValue,
    Authority,
    Client,
    ClientChange,
    ClientModel,
    EventAttribute,
    PolicyVersion,
)
from broker.reads.directory import fresh_directory
from demo.scenario import load_scenario

pytestmark = pytest.mark.django_db(databases=["default", "audit"])


def empty_the_fleet() -> None:
    """What a test database's flush does under a long-lived web process."""
    models = (AttributeValue, AttestationGrant, PolicyVersion, Client, Authority, ClientModel)
    for model in (*models, EventAttribute):
        model.objects.all().delete()


def test_a_fleet_emptied_and_refilled_to_the_same_size_is_read_anew():
    load_scenario(servers=4)
    with fresh_directory() as directory:
        assert len(directory.select(None)) == Client.objects.count() == 7
    empty_the_fleet()

    load_scenario(servers=4)

    with fresh_directory() as directory:
        assert directory.select(None) == set(Client.objects.values_list("id", flat=True))


def test_a_directory_that_has_not_read_the_change_log_for_a_day_is_read_anew():
    # Retention keeps two days of the log: what it dropped could have been unread here.
    load_scenario(servers=4)
    with fresh_directory() as directory:
        directory.last_read = replace(
            directory.last_read,
            monotonic=directory.last_read.monotonic - ClientChange.STALE_AFTER_S - 1,
        )
        old = directory

    with fresh_directory() as directory:
        assert directory is not old
        assert directory.select(None) == set(Client.objects.values_list("id", flat=True))
