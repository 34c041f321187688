"""The markdown leaderboard: a table of contents, the overview (every task's headline per backbone against its
reference, then wins / ties / losses), then the tasks in the paper's order (VTAB-1k, few-shot, LiT, ADE20K,
ImageNet-C, high-res; diagnostics last), each with its tables (protocol version, date, git sha), the sanity
table (each checkpoint against random init of its own architecture) and its figures (PNG and SVG)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

from ..records.aggregate import aggregate
from ..records.store import load_records
from .figures import plot_absolute, plot_deltas, use_colours
from .formats import delta_markdown, to_markdown
from .kinds import report_kinds
from .overview import overview_markdown, task_order
from .provenance import code_line, code_summary
from .tables import build_tables, sanity_table, stem_references
from .targets import sanity_targets, targets_markdown
from .versus import versus_markdown

TITLES = {
    "vtab": "VTAB-1k",
    "fewshot": "Few-shot linear probes",
    "lit": "LiT zero-shot",
    "ade20k": "ADE20K",
    "imagenet_c": "ImageNet-C",
    "hires": "High-res fine-tuning",
    "diagnose": "Diagnostics",
}


def anchor(title: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def task_tables(records: list[dict], reference: str | None = None) -> dict[str, tuple[list, object, list]]:
    """task -> (its tables, its report kind or None, its aggregated entries: [] for a report kind), in the
    paper's order."""
    kinds = report_kinds()
    kind_of = {r["task"]: r.get("report") or "" for r in records}
    kind_of = {t: k if k in kinds else "" for t, k in kind_of.items()}
    entries = aggregate([r for r in records if not kind_of[r["task"]]])
    out = {}
    for task in task_order(kind_of):
        recs = [r for r in records if r["task"] == task]
        report = kinds.get(kind_of[task])
        backbones = {r["backbone"] for r in recs}
        ref = reference if reference in backbones else None
        ents = []
        if report is not None:  # a report of the task's own (robustness, high-res, diagnostics, a plugin's)
            tables = report.tables(
                [r for r in recs if (r.get("report") or "") == kind_of[task]], ref if report.uses_reference else None
            )
        else:
            ents = [e for e in entries if e.task == task]
            tables = build_tables(ents, reference=ref)  # headline setting first
        if tables:
            out[task] = (tables, report, ents)
    return out


def overview(
    records: list[dict], reference: str | None = None, correct: bool = False, per_task: dict | None = None
) -> list[str]:
    """The overview's markdown lines (also `transferbench report --overview`); `per_task`: the records'
    `task_tables`, where the caller has them already."""
    if per_task is None:
        per_task = task_tables(records, reference)
    tables = [t for ts, report, _ in per_task.values() if report is None or report.uses_reference for t in ts]
    backbones = {task: {r["backbone"] for r in records if r["task"] == task} for task in per_task}
    return overview_markdown(
        tables,
        lambda task: stem_references(
            backbones.get(task, ()), reference if reference in backbones.get(task, ()) else None
        ),
        correct,
    )


def write_leaderboard(dirs: list, out: Path, **options) -> Path:
    """The leaderboard of the records in `dirs`, written to `out` with its figures beside it; returns `out`.
    `options`: `draw_leaderboard`'s (reference, git_sha, correct, strict)."""
    return draw_leaderboard(dirs, out, **options)[0]


FIGURE_LINK = re.compile(r"\]\(([^()\s]+\.png)\)")  # a section's figure: ![caption](NAME.png)


def draw_leaderboard(
    dirs: list,
    out: Path,
    reference: str | None = None,
    git_sha: str | None = None,
    correct: bool = False,
    strict: bool = False,
) -> tuple[Path, dict[str, list[Path]]]:
    """`write_leaderboard`, also returning each task's figures: the PNGs its section shows, in order."""
    records = load_records(dirs, strict=strict)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    use_colours({r["backbone"] for r in records})  # one colour per backbone in every figure below
    per_task = task_tables(records, reference)
    titles = {task: TITLES.get(task, task) for task in per_task}
    lines = [
        "# transferbench leaderboard",
        "",
        f"Generated {now}"
        + (f" at git {git_sha[:12]}" if git_sha else "")
        + f" from {len(records)} records in {', '.join(str(d) for d in dirs)}.",
        "",
        "- [Overview](#overview)",
        *(f"- [{titles[t]}](#{anchor(titles[t])})" for t in per_task),
        "",
        "## Overview",
        "",
        "The stem question: each backbone against the plain backbone of the same weights source "
        "(`mu4_dpn@embedded` against `mu4@embedded`, random-init `mu4_dpn` against random-init `mu4`"
        + (f"; here every backbone against `{reference}`, as asked" if reference else "")
        + "). Each task's section below also asks the sanity question: each checkpoint against random init of "
        "its own architecture.",
        "",
    ]
    lines += overview(records, reference, correct, per_task)
    lines += targets_section(per_task)
    figures = {}
    for task, (tables, report, ents) in per_task.items():
        section = task_section(
            task, titles[task], [r for r in records if r["task"] == task], tables, report, ents, out, reference
        )
        figures[task] = [out.parent / name for name in FIGURE_LINK.findall("\n".join(section))]
        lines += section
    out.write_text("\n".join(lines))
    return out, figures


__all__ = ["anchor", "draw_leaderboard", "overview", "task_tables", "write_leaderboard"]


def targets_section(per_task: dict) -> list[str]:
    """The sanity targets (`reporting.targets`): each checkpoint's gain over random init of its architecture on
    each target measure, and every set significantly worse than random init; nothing where no checkpoint has its
    random init beside it."""
    checks, worse = sanity_targets(per_task)
    if not checks:
        return []
    lines = [
        "### Sanity targets",
        "",
        "Each checkpoint against random init of its own architecture: the paired mean difference ± its 95% "
        "half-width over the shared seeds, as in each task's sanity table, and the target it must reach "
        "(`transferbench.reporting.targets`).",
        "",
        targets_markdown(checks),
        "",
    ]
    if worse:
        lines += [
            "Sets significantly worse than random init (95% interval below 0): "
            + "; ".join(
                f"{w.task}{' ' + w.setting if w.setting else ''} {w.column} {w.backbone} {w.gain:+.1f} ± "
                f"{w.half_width:.1f}"
                for w in worse
            )
            + ".",
            "",
        ]
    else:
        lines += ["No set of any sanity table is significantly worse than random init.", ""]
    return lines


def task_section(task: str, title: str, recs: list, tables: list, report, ents, out: Path, reference) -> list[str]:
    """One task's section: its header line (protocol, cells, code), its tables (or its report kind's section),
    the sanity table, the wide table and the figures (written beside `out`)."""
    lines: list[str] = []
    t = tables[0]
    shas = sorted({(r.get("environment") or {}).get("git_sha") or "unknown" for r in recs})
    devices = sorted({(r.get("environment") or {}).get("device") or "unknown" for r in recs})
    lines += [
        f"## {title}",
        "",
        f"Task `{task}`, protocol v{', v'.join(t.protocol_versions)}; {len(recs)} cells; last finished "
        f"{max(r.get('finished_at', '') for r in recs)[:19]}; records' git sha "
        f"{', '.join(s[:12] for s in shas)}; devices: {'; '.join(devices)}.",
        "",
        code_line(code_summary(recs)),
        "",
    ]
    if report is not None and report.section is not None:
        return lines + report.section(recs, tables, task, out) + versus_markdown(task, recs)
    lines += [to_markdown(x, title=False) for x in tables]
    lines += versus_markdown(task, recs, ents if report is None else None)
    if report is None or report.uses_reference:
        sanity = sanity_table(t)
        if sanity is not None:
            lines += [
                f"#### Sanity: pretraining against random init{' at ' + t.setting if t.setting else ''}",
                "",
                *delta_markdown(sanity),
                "",
            ]
    if len(tables) > 1 and report is None:  # the wide form: every dataset and setting in one table
        (wide,) = build_tables(
            ents, reference=reference if reference in {e.backbone for e in ents} else None, split_axes=False
        )
        lines += [
            "<details><summary>Every setting in one table</summary>",
            "",
            to_markdown(wide, title=False),
            "</details>",
            "",
        ]
        figure = plot_absolute(tables, out.parent / f"{out.stem}_{task}_curve.png")
        if figure:
            lines += [f"![{t.metric} per setting, every backbone]({figure.name})", ""]
    png = plot_deltas(t, out.parent / f"{out.stem}_{task}.png")
    if png:
        lines += [f"![Δ vs each row's reference{' at ' + t.setting if t.setting else ''}]({png.name})", ""]
    return lines
