"""The output formats of task tables: markdown (a table and its differences), LaTeX (booktabs), csv (a row per cell),
long csv (a row per seed) and json (`render`), with the marks, intervals and MDEs in words."""

from __future__ import annotations

import csv
import io
import json

from tabulate import tabulate

from ..errors import UserError
from ..hashing import canon
from ..records.stats import Estimate
from ..spec import seeds_shared
from .provenance import code_line
from .tables import Cellv, TaskTable

MARKS_TEXT = (
    "bold: significantly better than the row's reference (paired 95% interval excludes 0); italic: significantly worse"
)


def estimate_text(e: Estimate | None, signed=False, decimals: int = 1) -> str:
    """A table cell's mean ± 95% half-width ('—' without one; the mean alone for one seed)."""
    if e is None:
        return "—"
    mean = f"{e.mean:+.{decimals}f}" if signed else f"{e.mean:.{decimals}f}"
    if e.ci is None:
        return mean
    return f"{mean} (no variation)" if e.degenerate == "no variation" else f"{mean} ± {e.ci:.{decimals}f}"


def suite_words(task: str) -> str:
    """How a suite mean's interval of `task` is made, in a footnote's words (docs/statistics.md)."""
    if seeds_shared(task):
        return "t over the per-seed means, one run per seed serving every dataset"
    return "Welch's t over the independent dataset means"


def mark(text: str, v: Cellv | None, fmt: str = "md") -> str:
    """`text` marked as significantly better (bold) or worse (italic) than the row's reference."""
    if v is None or not (v.better or v.worse):
        return text
    if fmt == "latex":
        return ("\\textbf{%s}" if v.better else "\\textit{%s}") % text
    return f"**{text}**" if v.better else f"*{text}*"


def mde_text(d: Estimate | None, decimals: int = 1) -> str:
    """'n.s. (MDE ±x)' for a difference that is not significant: a tie is a tie only for effects above x; 'n/a (one
    seed)' without an interval; 'n.s. (no variation)' where every paired difference is the same (no power to speak
    of, rather than an MDE of 0)."""
    if d is None or d.ci is None:
        return "n/a (one seed)"
    if d.degenerate == "no variation":
        return "n.s. (no variation)"
    return "n.s." + (f" (MDE ±{d.mde:.{decimals}f})" if d.mde is not None else "")


def row_name(t: TaskTable, b: str) -> str:
    return b + (" (ref)" if b in t.refs.values() else "")


def to_markdown(t: TaskTable, title: bool = True) -> str:
    direction = {"max": "higher is better", "min": "lower is better"}.get(t.mode, "descriptive")
    head = [t.row_label, *t.columns, "seeds"]
    body = []
    for b, row in t.rows.items():
        cells = []
        for col in t.columns:
            v = row.get(col)
            cells.append(mark(estimate_text(v.estimate, decimals=t.decimals), v) if v else "—")
        body.append([row_name(t, b), *cells, t.seeds[b]])
    at = f" — {t.setting}" if t.setting else ""
    out = (
        [f"### {t.task}{at} — {t.metric} ({direction}), protocol v{', v'.join(t.protocol_versions)}", ""]
        if title
        else [f"{t.setting + ': ' if t.setting else ''}{t.metric} ({direction})", ""]
    )
    if title and t.code:
        out += [code_line(t.code), ""]
    if t.pixels:
        out += [pixels_line(t.pixels, list(t.rows)), ""]
    if t.changed:
        out += [changed_line(t.changed), ""]
    out += [tabulate(body, head, tablefmt="github", disable_numparse=True), ""]
    if t.refs:
        out += delta_markdown(t)
    cells = f"Cells: mean ± 95% CI half-width over seeds (t-interval; group means: {suite_words(t.task)})"
    out.append(t.footnote if t.footnote else f"{cells}; {MARKS_TEXT}." if t.refs else f"{cells}.")
    out += [f"- note: {n}" for n in t.notes]
    return "\n".join(out) + "\n"


def delta_markdown(t: TaskTable) -> list[str]:
    """The paired differences of `t`'s compared rows, each 'n.s. (MDE ±x)' below it where not significant."""
    several = len(t.references) > 1
    body = []
    for b, r in t.refs.items():
        cells = []
        for col in t.columns:
            v = t.rows[b].get(col)
            if v is None or v.delta is None:
                cells.append("—")
                continue
            text = mark(estimate_text(v.delta, signed=True, decimals=t.decimals), v)
            if not (v.better or v.worse):
                text += " " + mde_text(v.delta, t.decimals)
            cells.append(text)
        body.append([b, *([r] if several else []), *cells])
    vs = "its reference" if several else t.reference
    what = (
        "Pretraining vs random init of the same architecture"
        if t.question == "sanity"
        else f"Paired difference vs {vs}"
    )
    return [
        f"{what} (same seeds); bold / italic: 95% interval excludes 0 on the better / worse side; n.s.: not "
        "significant, with the smallest true difference its seeds would detect (MDE: 95% confidence, 80% power).",
        "",
        tabulate(
            body, ["backbone", *(["vs"] if several else []), *t.columns], tablefmt="github", disable_numparse=True
        ),
        "",
    ]


def changed_line(changed: set) -> str:
    """The header line naming each setting that did not come from the protocol's defaults, grouped by where it came
    from: 'Settings not at the protocol's defaults: batch 32, steps 50 (suite embedded); lr 0.01 (--set).'"""
    by_source: dict = {}
    for name, value, source in sorted(changed, key=lambda c: (c[2], c[0], str(c[1]))):
        by_source.setdefault(source, []).append(f"{name} {value}")
    groups = [f"{', '.join(dict.fromkeys(items))} ({source})" for source, items in by_source.items()]
    return "Settings not at the protocol's defaults: " + "; ".join(groups) + "."


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
            rows.append(
                {
                    "task": t.task,
                    "protocol_version": ",".join(t.protocol_versions),
                    "metric": t.metric,
                    "mode": t.mode,
                    "setting": t.setting,
                    "backbone": b,
                    "column": col,
                    "kind": "group" if col in t.group_columns else "dataset",
                    "mean": e.mean if e else None,
                    "ci": e.ci if e else None,
                    "n": e.n if e else 0,
                    "reference": t.refs.get(b),
                    "delta": d.mean if d else None,
                    "delta_ci": d.ci if d else None,
                    "delta_p": d.p if d else None,
                    "delta_mde": d.mde if d else None,
                    "delta_method": d.method if d else None,
                    "better": v.better,
                    "worse": v.worse,
                    "selected": canon(v.selected) if v.selected else None,
                }
            )
    return rows


def seed_rows(t: TaskTable) -> list[dict]:
    """The long form: one row per (backbone, dataset column, seed) with the value and the `select` setting (the
    learning rate, ...) that the column's final cells used."""
    out = []
    for b, row in t.rows.items():
        for col, v in row.items():
            if col in t.group_columns or not v.seeds:
                continue
            for seed, value in sorted(v.seeds.items()):
                out.append(
                    {
                        "task": t.task,
                        "protocol_version": ",".join(t.protocol_versions),
                        "metric": t.metric,
                        "setting": t.setting,
                        "backbone": b,
                        "column": col,
                        "seed": seed,
                        "value": value,
                        **{f"selected_{k}": x for k, x in sorted((v.selected or {}).items())},
                    }
                )
    return out


def to_latex(t: TaskTable) -> str:
    """A booktabs table of `t`: mean ± CI, bold / italic as in markdown, the differences under a midrule."""

    def esc(x: str) -> str:
        return x.replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("%", "\\%").replace("&", "\\&")

    def cell(text: str) -> str:
        return text.replace("±", "$\\pm$").replace("—", "--")

    cols = t.columns
    direction = {"max": "higher is better", "min": "lower is better"}.get(t.mode, "")
    lines = [
        f"% {t.task}{' — ' + t.setting if t.setting else ''}: {t.metric} ({direction}), protocol "
        f"v{', v'.join(t.protocol_versions)}; {MARKS_TEXT}",
        "\\begin{tabular}{l" + "r" * len(cols) + "}",
        "\\toprule",
        " & ".join([esc(t.row_label), *map(esc, cols)]) + " \\\\",
        "\\midrule",
    ]
    for b, row in t.rows.items():
        cells = [
            mark(cell(estimate_text(row[c].estimate, decimals=t.decimals)), row[c], "latex") if c in row else "--"
            for c in cols
        ]
        lines.append(" & ".join([esc(row_name(t, b)), *cells]) + " \\\\")
    if t.refs:
        lines.append("\\midrule")
        for b, r in t.refs.items():
            cells = []
            for c in cols:
                v = t.rows[b].get(c)
                cells.append(
                    mark(cell(estimate_text(v.delta, signed=True, decimals=t.decimals)), v, "latex")
                    if v is not None and v.delta is not None
                    else "--"
                )
            lines.append(" & ".join([esc(f"{b} − {r}"), *cells]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", ""]
    return "\n".join(lines)


FORMATS = ("md", "csv", "json", "long", "latex")


def json_data(tables: list[TaskTable], header: dict | None = None) -> dict:
    """The json format's object: a header with what made the tables, then a row per cell."""
    return {"header": header or {}, "rows": [r for t in tables for r in to_rows(t)]}


def render(tables: list[TaskTable], fmt: str = "md", header: dict | None = None) -> str:
    """The tables as markdown, LaTeX (booktabs), csv (a row per cell), long (csv, a row per seed) or json (a
    header with what made them, then the rows)."""
    if fmt == "md":
        return "\n".join(to_markdown(t) for t in tables)
    if fmt == "latex":
        return "\n".join(to_latex(t) for t in tables)
    if fmt == "json":
        return json.dumps(json_data(tables, header), indent=1)
    rows = [r for t in tables for r in (seed_rows(t) if fmt == "long" else to_rows(t))]
    if fmt in ("csv", "long"):
        buf = io.StringIO()
        if rows:
            names = list(dict.fromkeys(k for r in rows for k in r))
            w = csv.DictWriter(buf, fieldnames=names)
            w.writeheader()
            w.writerows(rows)
        return buf.getvalue()
    raise UserError(f"unknown format {fmt!r}; choose {', '.join(FORMATS)}")
