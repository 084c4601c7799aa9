"""The report jobs, one module per kind. Each has

    SECTIONS: dict[str, Section]
    def run(data: reports.spark.Dataset, params: reports.results.Params) -> Result

and computes only from the dataset (never from PostgreSQL). A job that reads frames it
derives from the tables (Dataset.derived) has

    def keep(data: reports.spark.Dataset) -> None

which computes them, so that a warm session's start keeps them before its first run."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from importlib import import_module
from types import ModuleType

from reports.results import Params

logger = logging.getLogger(__name__)

KINDS = ("timeline", "reach", "audit", "tree", "latency")


def job(kind: str) -> ModuleType:
    """The module of the report `kind`."""
    if kind not in KINDS:
        raise ValueError(f"no report {kind!r}; reports are {', '.join(KINDS)}")
    return import_module(f"reports.jobs.{kind}")


def keep_derived(data) -> None:
    """Compute every frame the jobs derive from the tables of `data` (a kept
    reports.spark.Dataset): each job's `keep`, where it has one."""
    for kind in KINDS:
        keep = getattr(job(kind), "keep", None)
        if keep is not None:
            keep(data)


REHEARSAL = timedelta(minutes=1)  # the newest events' window the warm-up runs over


def rehearse(data, kinds: tuple[str, ...] = KINDS, runs: list[Params] | None = None) -> None:
    """Run every report (of `kinds`) over `runs` (by default `rehearsals(data)`) on `data`
    (a kept reports.spark.Dataset), so that Spark compiles the code of their queries
    before an operator's first run and first change of region rather than during them.
    A window's bounds and a region reach that code as objects, not written into it:
    one rehearsal serves every later window and region. A report that fails here is
    logged and left: a run of it will say what is wrong."""
    runs = rehearsals(data) if runs is None else runs
    for kind in kinds:
        for params in runs:
            try:
                job(kind).run(data, params)
            except Exception:
                logger.exception("rehearsing the %s report failed", kind)


def rehearsals(data) -> list[Params]:
    """The runs a rehearsal makes: the newest minute of events of `data`, over every
    region and over one (none when no event was exported)."""
    newest = _newest_event(data)
    if newest is None:
        return []
    whole = Params(window_start=newest - REHEARSAL, window_end=newest + timedelta(seconds=1))
    region = _a_region(data)
    return [whole, replace(whole, region=region)] if region else [whole]


def _newest_event(data) -> datetime | None:
    from pyspark.sql import functions as F  # here: importing KINDS must not load Spark

    micros = data.table("events").agg(F.unix_micros(F.max("published_at"))).first()[0]
    if micros is None:
        return None
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


def _a_region(data) -> str | None:
    from pyspark.sql import functions as F

    found = data.table("clients").where(F.col("region").isNotNull()).select("region").first()
    return found["region"] if found else None
