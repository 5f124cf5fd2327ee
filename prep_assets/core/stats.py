"""What a layer build reports: one frozen dataclass per layer, the one definition behind its stats file, the Dagster
metadata of its asset and the figures the manifest and the run summary read.

A field is declared with `figure`: its label in the UI (`ui`, none: not shown there), how a mapping is shown
(`table`: "counts" by `key`, "percentiles", or "domain_counts": a row per domain), and `optional` for a field a
build reports only in some datasets (left out of the stats file when it is None, so a file lists exactly what
applies).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, TypeVar

Table = Literal["counts", "percentiles", "domain_counts"]
S = TypeVar("S", bound="LayerStats")


def figure(ui: str | None = None, *, table: Table | None = None, key: str = "reason", optional: bool = False) -> Any:
    """A stats field: its UI label, how a mapping field is tabled, and whether it may be absent (None)."""
    meta = {"ui": ui, "table": table, "key": key, "optional": optional}
    return field(default=None if optional else MISSING, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One field of a stats object as the UI shows it."""

    label: str
    value: Any
    table: Table | None
    key: str


@dataclass(frozen=True, kw_only=True)
class LayerStats:
    """Base of the layers' stats: serialized in field order, read back by name."""

    def as_json(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not (f.metadata.get("optional") and getattr(self, f.name) is None)
        }

    @classmethod
    def from_json(cls: type[S], data: dict[str, Any]) -> S:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def figures(self) -> list[Figure]:
        """The fields the UI shows, in declaration order (absent optional ones left out)."""
        return [
            Figure(
                label=f.metadata["ui"], value=getattr(self, f.name), table=f.metadata["table"], key=f.metadata["key"]
            )
            for f in fields(self)
            if f.metadata.get("ui") and getattr(self, f.name) is not None
        ]
