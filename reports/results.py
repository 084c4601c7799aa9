"""What a report job takes and gives: its parameters, and its results as named sections
of rows whose fields are declared (so that pages, tables and CSV need no guessing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

# How a field's values are shown: "text", "int", "float", "percent" (0..1),
# "seconds", "time" (ISO 8601, UTC).
FIELD_TYPES = frozenset({"text", "int", "float", "percent", "seconds", "time"})


@dataclass(frozen=True)
class Field:
    """One field of a section's rows."""

    name: str
    label: str
    type: str = "text"

    def __post_init__(self) -> None:
        if self.type not in FIELD_TYPES:
            raise ValueError(f"unknown field type {self.type!r} for {self.name}")


@dataclass(frozen=True)
class Section:
    """A named list of rows in a report's results (a table, a chart's series)."""

    label: str
    fields: tuple[Field, ...]

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]


@dataclass(frozen=True)
class Params:
    """What a run covers: events published in [window_start, window_end), and one
    region's receivers (or every region's, when `region` is empty)."""

    window_start: datetime
    window_end: datetime
    region: str = ""


@dataclass
class Result:
    """A job's answer: headline figures, and each section's rows (dicts of its
    fields' names to JSON values; times as ISO 8601 strings)."""

    summary: dict = field(default_factory=dict)
    sections: dict[str, list[dict]] = field(default_factory=dict)
