"""The report jobs, one module per kind. Each has

    SECTIONS: dict[str, Section]
    def run(data: reports.spark.Dataset, params: reports.results.Params) -> Result

and computes only from the dataset (never from PostgreSQL)."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

KINDS = ("timeline", "reach", "audit", "tree", "latency")


def job(kind: str) -> ModuleType:
    """The module of the report `kind`."""
    if kind not in KINDS:
        raise ValueError(f"no report {kind!r}; reports are {', '.join(KINDS)}")
    return import_module(f"reports.jobs.{kind}")
