"""Tables: one per task, a row per backbone, a column per dataset (+ group means), `mean ± ci`.

With a reference backbone, a cell is bold when its paired per-seed difference from the reference is a
significant improvement (95% interval excludes 0 on the better side) — the DPN paper's Table 3 rule —
and a second table gives the differences themselves.
"""
from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tabulate import tabulate

from ..errors import UserError, close_matches
from ..hashing import canon
from ..plugins import load_group
from ..records.aggregate import Entry, aggregate, value_order
from ..records.stats import Estimate, bootstrap_suite_mean, paired_difference, paired_suite_difference

ALL = "mean"  # the column averaging every dataset of a task


@dataclass
class Cellv:
    estimate: Estimate | None
    delta: Estimate | None = None
    better: bool = False  # significantly better than the reference
    worse: bool = False


@dataclass
class TaskTable:
    task: str
    protocol_versions: list[str]
    metric: str
    mode: str
    columns: list[str]  # dataset columns, then group means
    group_columns: list[str]
    rows: dict[str, dict[str, Cellv]] = field(default_factory=dict)  # backbone -> column -> value
    seeds: dict[str, str] = field(default_factory=dict)  # backbone -> "3" or "2-3"
    reference: str | None = None
    notes: list[str] = field(default_factory=list)
    setting: str = ""  # the report-axis setting of a table split by axis ('shots=25'), else ''
    decimals: int = 1  # digits after the point in the markdown cells
    footnote: str | None = None  # what the cells are, when not the default (means over seeds)
    row_label: str = "backbone"  # what a row is (the DTN diagnostics table: a norm of one backbone)
    pixels: dict = field(default_factory=dict)  # backbone -> the input normalisation of its cells


def _judge(delta: Estimate | None, mode: str) -> tuple[bool, bool]:
    if delta is None or not delta.excludes_zero:
        return False, False
    better = (delta.mean > 0) == (mode == "max")
    return better, not better


def axis_settings(entries: list[Entry]) -> list[dict]:
    """The report-axis settings of a task's entries (few-shot {'shots': 25}, ...), headline first: the
    largest value (most shots, the full train fraction), then down."""
    settings = {canon(e.axes): e.axes for e in entries}
    def key(axes):  # numbers down from the largest, then anything else by its text
        return [(kind, -number, text) for kind, number, text in (value_order(axes[k]) for k in sorted(axes))]
    return sorted(settings.values(), key=key)


def build_tables(entries: list[Entry], reference: str | None = None, split_axes: bool = True) -> list[TaskTable]:
    """One table per task and protocol version (the newest first: cells of two protocols never share a table);
    with `split_axes` a task with report axes (few-shot shots) gets one table per axis setting, headline first,
    each with its group means. Without, one wide table with a column per dataset and setting (csv/json, the
    leaderboard's details)."""
    by_task = defaultdict(list)
    for e in entries:
        by_task[e.task].append(e)
    for task, ents in by_task.items():
        backbones = sorted({e.backbone for e in ents})
        if reference is not None and reference not in backbones:
            raise UserError(f"--reference {reference!r} has no results for task {task!r}"
                            f"{close_matches(reference, backbones)}; backbones: {', '.join(backbones)}")
    by_protocol = defaultdict(list)
    for e in entries:
        by_protocol[(e.task, e.protocol_version)].append(e)
    tables = []
    for (task, _), ents in sorted(by_protocol.items(), key=lambda kv: (list(by_task).index(kv[0][0]),
                                                                       _newest_first(kv[0][1]))):
        if reference is not None and reference not in {e.backbone for e in ents}:
            reference_here = None  # the reference ran under another protocol version only
        else:
            reference_here = reference
        if split_axes and any(e.axes for e in ents):
            for setting in axis_settings(ents):
                same = [e for e in ents if e.axes == setting]
                title = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in sorted(setting.items()))
                tables.append(_table(task, same, reference_here, setting=title))
        else:
            tables.append(_table(task, ents, reference_here))
    return tables


def _newest_first(version: str) -> tuple:
    try:
        return (0, -float(version), "")
    except ValueError:
        return (1, 0.0, version)


def _table(task: str, ents: list[Entry], reference: str | None, setting: str = "") -> TaskTable:
    """The table of `ents`: a column per dataset (per dataset and axis setting when settings are mixed),
    then group means; rows are backbones, the reference first."""
    backbones = sorted({e.backbone for e in ents})
    wide = not setting and any(e.axes for e in ents)
    column = (lambda e: e.column) if wide else (lambda e: e.dataset)
    # dataset order of the spec, then report-axis values by value (shots 1, 5, 10, 25; not as text)
    order = sorted({(e.order, tuple((k, value_order(v)) for k, v in sorted(e.axes.items())), column(e), e.dataset,
                     e.group) for e in ents})
    order = [(o, c, d, g) for o, _, c, d, g in order]
    columns = [c for _, c, _, _ in order]
    # suite means need >= 2 datasets; columns of different axis settings (few-shot shots) are not averaged
    members = defaultdict(list)
    for _, col, _, g in order:
        members[g].append(col)
    groups = [] if wide else [g for g in members if g and len(members[g]) > 1]
    if len(groups) == 1 and len(members[groups[0]]) == len(columns):
        groups = []  # one group holding everything: its mean is the overall mean
    group_columns = groups + ([ALL] if len(columns) > 1 and not wide else [])
    first = ents[0]
    t = TaskTable(task, sorted({e.protocol_version for e in ents}), first.metric, first.mode,
                  columns + group_columns, group_columns, reference=reference, setting=setting)
    cell_of = {(e.backbone, column(e)): e for e in ents}
    for e in ents:
        if e.pixels:
            t.pixels.setdefault(e.backbone, set()).add(e.pixels)
    rows = ([reference] if reference else []) + [b for b in backbones if b != reference]
    for b in rows:
        row = {}
        ns = set()
        for col in columns:
            e = cell_of.get((b, col))
            if e is None:
                continue
            ref = cell_of.get((reference, col)) if reference and b != reference else None
            delta = paired_difference(e.per_seed, ref.per_seed) if ref else None
            row[col] = Cellv(e.estimate, delta, *_judge(delta, first.mode))
            if e.estimate:
                ns.add(e.estimate.n)
            if e.note:
                t.notes.append(f"{b} / {col}: {e.note}")
        for g in group_columns:
            members_g = [c for _, c, _, grp in order if g == ALL or grp == g]
            if not all(col in row and row[col].estimate for col in members_g):
                continue  # a backbone missing a dataset has no comparable suite mean
            per = {c: cell_of[(b, c)].per_seed for c in members_g}
            est = bootstrap_suite_mean({c: list(v.values()) for c, v in per.items()})
            delta = None
            if reference and b != reference and all((reference, c) in cell_of for c in members_g):
                delta = paired_suite_difference(per, {c: cell_of[(reference, c)].per_seed for c in members_g})
            row[g] = Cellv(est, delta, *_judge(delta, first.mode))
        t.rows[b] = row
        t.seeds[b] = seed_counts(ns)
    return t


def seed_counts(ns) -> str:
    """A row's seeds column: '3', or '2-3' when its cells have different numbers of seeds, '0' without any."""
    ns = set(ns)
    return (str(min(ns)) if len(ns) == 1 else f"{min(ns)}-{max(ns)}") if ns else "0"


def _fmt(e: Estimate | None, signed=False, decimals: int = 1) -> str:
    if e is None:
        return "—"
    mean = f"{e.mean:+.{decimals}f}" if signed else f"{e.mean:.{decimals}f}"
    return mean if e.ci is None else f"{mean} ± {e.ci:.{decimals}f}"


def to_markdown(t: TaskTable, title: bool = True) -> str:
    direction = {"max": "higher is better", "min": "lower is better"}.get(t.mode, "descriptive")
    head = [t.row_label, *t.columns, "seeds"]
    body = []
    for b, row in t.rows.items():
        cells = []
        for col in t.columns:
            v = row.get(col)
            text = _fmt(v.estimate, decimals=t.decimals) if v else "—"
            cells.append(f"**{text}**" if v and v.better else text)
        body.append([b + (" (ref)" if b == t.reference else ""), *cells, t.seeds[b]])
    at = f" — {t.setting}" if t.setting else ""
    out = [f"### {t.task}{at} — {t.metric} ({direction}), protocol v{', v'.join(t.protocol_versions)}", ""] if title \
        else [f"{t.setting + ': ' if t.setting else ''}{t.metric} ({direction})", ""]
    if t.pixels:
        out += [pixels_line(t.pixels, list(t.rows)), ""]
    out += [tabulate(body, head, tablefmt="github", disable_numparse=True), ""]
    if t.reference and len(t.rows) > 1:
        body = []
        for b, row in t.rows.items():
            if b == t.reference:
                continue
            cells = []
            for col in t.columns:
                v = row.get(col)
                text = _fmt(v.delta, signed=True, decimals=t.decimals) if v else "—"
                cells.append(f"**{text}**" if v and (v.better or v.worse) else text)
            body.append([b, *cells])
        out += [f"Paired difference vs {t.reference} (same seeds); bold = 95% interval excludes 0.", "",
                tabulate(body, ["backbone", *t.columns], tablefmt="github", disable_numparse=True), ""]
    out.append(t.footnote if t.footnote else
               "Cells: mean ± 95% CI half-width over seeds (t-interval; group means: bootstrap over seeds"
               " within each dataset); bold: significantly better than the reference." if t.reference else
               "Cells: mean ± 95% CI half-width over seeds (t-interval; group means: bootstrap over seeds"
               " within each dataset).")
    out += [f"- note: {n}" for n in t.notes]
    return "\n".join(out) + "\n"


def pixels_line(pixels: dict, order: list) -> str:
    """The header line that says how each backbone's input pixels were normalised (data.pixels)."""
    named = {b: ", ".join(sorted(v)) for b, v in pixels.items()}
    values = set(named.values())
    if len(values) == 1 and set(named) >= set(order):
        return f"Input pixels: {values.pop()} for every backbone."
    return "Input pixels: " + "; ".join(f"{b} {named[b]}" for b in order if b in named) + "."


def to_rows(t: TaskTable) -> list[dict]:
    rows = []
    for b, row in t.rows.items():
        for col, v in row.items():
            e, d = v.estimate, v.delta
            rows.append({"task": t.task, "protocol_version": ",".join(t.protocol_versions), "metric": t.metric,
                         "setting": t.setting, "backbone": b, "column": col, "kind": "group" if col in t.group_columns else "dataset",
                         "mean": e.mean if e else None, "ci": e.ci if e else None, "n": e.n if e else 0,
                         "reference": t.reference, "delta": d.mean if d else None, "delta_ci": d.ci if d else None,
                         "better": v.better, "worse": v.worse})
    return rows


def render(tables: list[TaskTable], fmt: str = "md") -> str:
    if fmt == "md":
        return "\n".join(to_markdown(t) for t in tables)
    rows = [r for t in tables for r in to_rows(t)]
    if fmt == "json":
        return json.dumps(rows, indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        if rows:
            w = csv.DictWriter(buf, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        return buf.getvalue()
    raise UserError(f"unknown format {fmt!r}; choose md, csv or json")


def default_reference(backbones: list[str]) -> str | None:
    """The one plain backbone (no stem, no DTN: 'mu4', 'b32@ckpt') that the others modify, if any."""
    plain = [b for b in backbones if "_" not in b.partition("@")[0]]
    return plain[0] if len(plain) == 1 else None


@dataclass(frozen=True)
class Report:
    """A report of its own for a task whose cells name it (`Cell.report`), registered under the entry-point group
    `transferbench.reports` (built-ins: corruption, hires, diagnostics) so that a plugin adapter can bring one.
    `tables(records, reference)` builds its tables; `section(records, tables, task, out)`, if given, writes its
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
    return out
