"""The reports' rehearsal as the worker starts (reports.jobs.rehearse): the code of
every report's queries compiled before an operator's first run."""

from __future__ import annotations

from dataclasses import replace

from reports.jobs import KINDS, job, rehearse
from tests.reports.incident import READING_MARKS
from tests.reports.spark_helpers import compiled_classes

pytestmark = READING_MARKS

# Spark compiles a few classes again now and then, whatever ran before (the same code
# twice in one run; 2 to 10 classes in the runs measured, why is not known); a first
# run of the five reports without the rehearsal compiled 386.
NOW_AND_THEN = 20


def test_after_the_rehearsal_another_window_and_region_compile_next_to_no_code(incident):
    data = incident.data
    rehearse(data)
    compiled = compiled_classes(incident.spark)
    clients = data.table("clients").select("region").distinct().collect()
    region = max(row.region for row in clients if row.region)
    # The rehearsal runs over the newest minute and over the first region it finds;
    # this is an hour (the timeline's buckets as long) and another region.
    for kind in KINDS:
        for params in (incident.params, replace(incident.params, region=region)):
            job(kind).run(data, params)
    assert compiled_classes(incident.spark) - compiled <= NOW_AND_THEN
