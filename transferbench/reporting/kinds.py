"""Report kinds: a task whose cells name one (`Cell.report`) gets that kind's tables (`Report`, registered under the
entry-point group `transferbench.reports`); `report_tables` builds the tables of any mix of records."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..plugins import load_group
from ..records.aggregate import aggregate
from .provenance import annotate_code
from .tables import TaskTable, build_tables


@dataclass(frozen=True)
class Report:
    """A report of its own for a task whose cells name it (`Cell.report`), registered under the entry-point group
    `transferbench.reports` (built-ins: corruption, hires, diagnostics) so that a plugin adapter can bring one.
    `tables(records, reference)` builds its tables, pairing rows by `pair(t, stem_references(t.rows, reference))`
    (`reference`: the user's --reference or None); `section(records, tables, task, out)`, if given, writes its
    leaderboard section's markdown lines (figures beside `out`), else each table follows with the Δ figure of
    the first; `uses_reference`: whether the tables compare against a reference backbone."""

    tables: Callable[[list, str | None], list]
    section: Callable[[list, list, str, Path], list] | None = None
    uses_reference: bool = True


def report_kinds() -> dict[str, Report]:
    """Every installed report kind."""
    return load_group("transferbench.reports")


def report_tables(records: list[dict], reference: str | None = None, split_axes: bool = True) -> list[TaskTable]:
    """The tables of any mix of records: those of tasks with a report of their own (`report_kinds`) and
    everything else (one metric per cell, `build_tables`)."""
    installed = report_kinds()
    kinds = defaultdict(list)
    for r in records:
        kind = r.get("report") or ""
        kinds[kind if kind in installed else ""].append(r)
    rest = kinds.pop("", [])
    out = build_tables(aggregate(rest), reference=reference, split_axes=split_axes) if rest else []
    for kind, recs in kinds.items():
        out += installed[kind].tables(recs, reference)
    return annotate_code(out, records)
