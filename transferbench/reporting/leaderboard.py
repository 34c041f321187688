"""The markdown leaderboard (per task: table, paired differences, protocol version, date, git sha) and
PNG plots of each backbone's difference from the reference with 95% error bars."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from .aggregate import aggregate
from .records import load_records
from .tables import TaskTable, build_tables, to_markdown


def default_reference(backbones: list[str]) -> str | None:
    """The one plain backbone (no stem, no DTN: 'mu4', 'b32@ckpt') that the others modify, if any."""
    plain = [b for b in backbones if "_" not in b.partition("@")[0]]
    return plain[0] if len(plain) == 1 else None


def plot_deltas(t: TaskTable, path: Path) -> Path | None:
    from .figures import finish, pyplot

    plt = pyplot()
    others = [b for b in t.rows if b != t.reference]
    if not t.reference or not others:
        return None
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(t.columns) + 2), 3.6))
    width = 0.8 / len(others)
    for i, b in enumerate(others):
        xs, ys, errs = [], [], []
        for j, col in enumerate(t.columns):
            v = t.rows[b].get(col)
            if v is not None and v.delta is not None:
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(v.delta.mean)
                errs.append(v.delta.ci or 0.0)
        ax.errorbar(xs, ys, yerr=errs, fmt="o", capsize=3, label=b)
    ax.axhline(0, color="grey", lw=0.8)
    for j in range(len(t.columns) - len(t.group_columns), len(t.columns)):
        ax.axvspan(j - 0.5, j + 0.5, color="0.93", zorder=0)  # group means on a grey background
    ax.set_xticks(range(len(t.columns)))
    ax.set_xticklabels(t.columns, rotation=30, ha="right")
    ax.set_ylabel(f"Δ {t.metric} vs {t.reference}")
    ax.set_title(f"{t.task}{' (' + t.setting + ')' if t.setting else ''}: paired difference, 95% CI over seeds")
    return finish(fig, path, ax, dpi=120, fontsize=8, gap=1.01)


def write_leaderboard(dirs: list, out: Path, reference: str | None = None, git_sha: str | None = None) -> Path:
    from .diagnostics import figures as diagnostic_figures
    from .robustness import plot_severity
    from .tables import special_report

    records = load_records(dirs)
    kind_of = {r["task"]: r.get("report") or "" for r in records}
    kind_of = {t: k if special_report(k) else "" for t, k in kind_of.items()}
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
        if kind:  # robustness, high-res, diagnostics: their own tables
            backbones = sorted({r["backbone"] for r in recs})
            ref = reference if reference in backbones else default_reference(backbones)
            tables = special_report(kind)([r for r in recs if (r.get("report") or "") == kind],
                                          reference=None if kind == "diagnostics" else ref)
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
        if kind == "corruption":  # a table and two figures per dataset
            for x in tables:
                dataset = x.setting.split(";")[0]
                lines += [f"### {dataset}", "", to_markdown(x, title=False)]
                png = plot_severity(recs, task, dataset, out.parent / f"{out.stem}_{task}_{dataset}.png")
                if png:
                    lines += [f"![error vs severity, {dataset}]({png.name})", ""]
                png = plot_deltas(x, out.parent / f"{out.stem}_{task}_{dataset}_delta.png")
                if png:
                    lines += [f"![Δ vs {x.reference}, {dataset}]({png.name})", ""]
            continue
        if kind == "diagnostics":  # per dataset: the figures, then a table per measure
            pngs = diagnostic_figures(recs, out.parent, out.stem)
            for dataset in dict.fromkeys(x.setting.split(";")[0] for x in tables):
                lines += [f"### {dataset}", ""]
                lines += [f"![{caption}, {dataset}]({png.name})\n" for d, caption, png in pngs if d == dataset]
                lines += [to_markdown(x, title=False) for x in tables if x.setting.split(";")[0] == dataset]
            continue
        lines += [to_markdown(x, title=False) for x in tables]
        if len(tables) > 1 and not kind:  # the wide form: every dataset and setting in one table
            (wide,) = build_tables(ents, reference=ref, split_axes=False)
            lines += ["<details><summary>Every setting in one table</summary>", "", to_markdown(wide, title=False),
                      "</details>", ""]
        png = plot_deltas(t, out.parent / f"{out.stem}_{t.task}.png")
        if png:
            lines += [f"![Δ vs {t.reference}{' at ' + t.setting if t.setting else ''}]({png.name})", ""]
    out.write_text("\n".join(lines))
    return out
