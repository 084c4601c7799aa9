"""Rows that a module's tests only read, written once for the module.

Loading the scenario takes a second or two, and most page and read tests only look at
it: written once inside a transaction that each test runs in (in a savepoint of its
own, so that what a test writes goes with it), and rolled back after the module. Each
test gets its own copy of the Python handles, as they were when written, so that one
test's changes to them never reach another. Not for modules with transactional tests,
which would wait on this transaction."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db import transaction

from demo.scenario import Scenario, load_scenario


@contextmanager
def written_for_the_module(django_db_blocker) -> Iterator[None]:
    """Around what a module-scoped fixture writes, and its yield."""
    with django_db_blocker.unblock(), transaction.atomic():
        yield
        transaction.set_rollback(True)


def scenario_for_the_module(servers: int, then: Callable[[Scenario], None] | None = None):
    """A module-scoped fixture: the scenario with `servers` web servers (and whatever
    `then` adds to it), written once for the module. Tests take it through a fixture
    of their own that returns `copy_for_the_test(...)` of it."""

    @pytest.fixture(scope="module")
    def loaded(django_db_setup, django_db_blocker) -> Iterator[Scenario]:
        with written_for_the_module(django_db_blocker):
            scenario = load_scenario(servers=servers)
            if then is not None:
                then(scenario)
            yield scenario

    return loaded


def copy_for_the_test(handles):
    """The module's handles as they were written, for one test to use and change."""
    return copy.deepcopy(handles)
