"""The report jobs, one module per kind. Each has

    SECTIONS: dict[str, Section]
    def run(data: reports.spark.Dataset, params: reports.results.Params) -> Result

and computes only from the dataset (never from PostgreSQL). A job that reads frames it
derives from the tables (Dataset.derived) has

    def keep(data: reports.spark.Dataset) -> None

which computes them, so that a warm session's start keeps them before its first run."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

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
