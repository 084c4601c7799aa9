"""Fixtures of the reports' tests: a SparkSession in a process of its own, and the worm
incident played through the real service and exported to a dataset of the test's own
(the process's own SparkSession, `spark`, is tests/conftest.py's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from tests.broker.tree_helpers import wait_until_idle
from tests.conftest import ROOT
from tests.reports.incident import Incident, play_incident


@pytest.fixture
def spark_in_a_process():
    """Run Python `code` in a new process with the settings set up (so that it starts a
    JVM of its own), `env` added to its environment; what it wrote."""

    def run(code: str, **env: str) -> subprocess.CompletedProcess:
        prelude = "import django; django.setup()\n"
        return subprocess.run(
            [sys.executable, "-c", prelude + code], cwd=ROOT, env={**os.environ, **env},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    return run


@pytest.fixture
def worm_incident(celery_worker, spark, settings, tmp_path) -> Incident:
    """The incident (tests.reports.incident), exported to this test's own dataset
    folder. Test modules using it need tests.reports.incident.INCIDENT_MARKS."""
    root = tmp_path / "dataset"
    settings.REPORTS_DATASET = root
    return play_incident(spark=spark, root=root)


@pytest.fixture(scope="package")
def incident(django_db_setup, django_db_blocker, celery_worker, spark, tmp_path_factory):
    """The incident played and exported once for every module whose tests only read it
    (playing it takes seconds of real time: its status command must expire).

    Its tests are plain `django_db` tests (tests.reports.incident.READING_MARKS): each
    runs in a transaction that is rolled back, sees what was committed here and leaves
    it as it was. Those modules run last in this package (see below), so that no
    transactional test empties the tables under them; the tables are emptied after
    them, as after a transactional test."""
    root = tmp_path_factory.mktemp("incident") / "dataset"
    with django_db_blocker.unblock(), override_settings(REPORTS_DATASET=root):
        try:
            yield play_incident(spark=spark, root=root)
        finally:
            wait_until_idle()
            call_command("flush", interactive=False, verbosity=0, database="default")


# Modules that add to the incident run after those that only read it.
ADDING_TO_THE_INCIDENT = ("test_audit_report.py",)


def pytest_collection_modifyitems(items) -> None:
    """Move the tests that share the played incident to the end of this package, those
    that add to it last, keeping every other order."""
    here = Path(__file__).parent
    in_package = [i for i in items if here in Path(i.path).parents]
    sharing = [i for i in in_package if "incident" in i.fixturenames]
    if not sharing:
        return
    sharing.sort(key=lambda item: Path(item.path).name in ADDING_TO_THE_INCIDENT)
    last = items.index(in_package[-1])
    moved = set(map(id, sharing))
    before = [i for i in items[: last + 1] if id(i) not in moved]
    items[:] = before + sharing + items[last + 1 :]
