"""The markdown leaderboard (per task: table, paired differences, protocol version, date, git sha) and
PNG plots of each backbone's difference from the reference with 95% error bars."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from ..records.aggregate import aggregate
from ..records.store import load_records
from .figures import plot_deltas
from .tables import build_tables, default_reference, report_kinds, to_markdown


def write_leaderboard(dirs: list, out: Path, reference: str | None = None, git_sha: str | None = None) -> Path:
    records = load_records(dirs)
    kinds = report_kinds()
    kind_of = {r["task"]: r.get("report") or "" for r in records}
    kind_of = {t: k if k in kinds else "" for t, k in kind_of.items()}
    entries = aggregate([r for r in records if not kind_of[r["task"]]])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# transferbench leaderboard", "",
             f"Generated {now}" + (f" at git {git_sha[:12]}" if git_sha else "") +
             f" from {len(records)} records in {', '.join(str(d) for d in dirs)}.", ""]
    for task in sorted(kind_of):
        recs = [r for r in records if r["task"] == task]
        kind = kind_of[task]
        report = kinds.get(kind)
        if report is not None:  # a report of the task's own (robustness, high-res, diagnostics, a plugin's)
            backbones = sorted({r["backbone"] for r in recs})
            ref = reference if reference in backbones else default_reference(backbones)
            tables = report.tables([r for r in recs if (r.get("report") or "") == kind],
                                   ref if report.uses_reference else None)
        else:
            ents = [e for e in entries if e.task == task]
            backbones = sorted({e.backbone for e in ents})
            ref = reference if reference in backbones else default_reference(backbones)
            tables = build_tables(ents, reference=ref)  # one per report-axis setting, headline first
        if not tables:
            continue
        t = tables[0]
        shas = sorted({(r.get("environment") or {}).get("git_sha") or "unknown" for r in recs})
        devices = sorted({(r.get("environment") or {}).get("device") or "unknown" for r in recs})
        lines += [f"## {t.task}", "",
                  f"Protocol v{', v'.join(t.protocol_versions)}; {len(recs)} cells; last finished "
                  f"{max(r.get('finished_at', '') for r in recs)[:19]}; records' git sha "
                  f"{', '.join(s[:12] for s in shas)}; devices: {'; '.join(devices)}.", ""]
        if report is not None and report.section is not None:
            lines += report.section(recs, tables, task, out)
            continue
        lines += [to_markdown(x, title=False) for x in tables]
        if len(tables) > 1 and report is None:  # the wide form: every dataset and setting in one table
            (wide,) = build_tables(ents, reference=ref, split_axes=False)
            lines += ["<details><summary>Every setting in one table</summary>", "", to_markdown(wide, title=False),
                      "</details>", ""]
        png = plot_deltas(t, out.parent / f"{out.stem}_{t.task}.png")
        if png:
            lines += [f"![Δ vs {t.reference}{' at ' + t.setting if t.setting else ''}]({png.name})", ""]
    out.write_text("\n".join(lines))
    return out
