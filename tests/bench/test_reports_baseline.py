"""The reports benchmark's single-process baseline (bench/reports_baseline.py) computes
every report as its Spark job does (reports/jobs/), on the worm incident exported twice
(deliveries answered after the first export are read at their latest version), over
the whole incident, one region, and an empty window.

Every section is ordered by a key unique within it, so rows are compared in order;
floats to a relative 1e-9.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pyarrow.parquet as pq
import pytest

from bench.reports_baseline import baseline_result, run_baseline
from broker.audit import Actor
from broker.models import Delivery
from broker.services.deliveries import acknowledge_delivery
from reports import kept
from reports.dataset import batches
from reports.jobs import KINDS, job
from reports.results import Params, Result
from reports.runner import keep_dataset
from tests.reports.compare import differences
from tests.reports.incident import INCIDENT_MARKS, Incident

pytestmark = INCIDENT_MARKS

LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


@pytest.fixture
def answered_late(worm_incident, monkeypatch) -> Incident:
    """The incident, then every delivery received and not answered is acknowledged
    and exported again: those deliveries are in two batches, the newer one answered.
    The first export is kept as the reports worker keeps it, and the second's changes
    to it are kept apart from it (reports.kept.Changes), however many they are."""
    keep_dataset()
    monkeypatch.setattr(kept, "MERGE_SHARE", math.inf)
    waiting = Delivery.objects.filter(state=Delivery.State.DELIVERED).select_related("receiver")
    for delivery in waiting:
        receiver = delivery.receiver
        acknowledge_delivery(
            client=receiver,
            delivery_id=delivery.pk,
            status="ok",
            result={"done": True},
            actor=Actor("client", receiver.name),
        )
    worm_incident.export()
    return worm_incident


def runs(incident: Incident) -> dict[str, Params]:
    return {
        "the whole incident": incident.params,
        "the Northwest": replace(incident.params, region="Northwest"),
        "an empty window": Params(LONG_AGO, LONG_AGO + timedelta(hours=1)),
    }


# Fifteen Spark jobs on one played incident: cheaper than playing it once per report.
@pytest.mark.timeout(900)
def test_the_baseline_computes_every_report_as_its_spark_job_does(answered_late):
    assert versions_per_delivery(answered_late) > 1
    problems = []
    for kind in KINDS:
        for name, params in runs(answered_late).items():
            spark = job(kind).run(answered_late.data, params)
            duck = baseline_result(kind, answered_late.root, params)
            problems += [f"{kind}, {name}, {found}" for found in differences(spark, duck)]
            assert run_baseline(kind, answered_late.root, params) == rows(spark)
    for name in ("deliveries to receivers", "audit entries read"):
        assert kept._kept[name].changes is not None, name  # read as kept, with changes
    assert not problems, "\n".join(problems)


def versions_per_delivery(incident: Incident) -> float:
    """Row versions in the deliveries' batches per delivery (1: nothing to choose)."""
    folder = incident.root / "deliveries"
    assert len(batches(folder)) == 2
    ids = pq.read_table(folder, columns=["id"])["id"].to_pylist()
    return len(ids) / len(set(ids))


def rows(result: Result) -> int:
    return sum(len(section) for section in result.sections.values())
