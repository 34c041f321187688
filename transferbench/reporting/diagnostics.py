"""Diagnostics reports: a table per measure (rows backbones, columns layers: mean ± 95% CI) and the figures —
measure vs depth with one line per backbone and a 95% band, mean attention distance per head against depth (the
ViT / ConViT scatter), DPN's stem scale maps as images, DTN's mixing weights and kernel widths per head and its
kernels P^h as maps, the patch embedding's gradient norm over the fine-tuning steps, and, for checkpoints whose
pretraining logged them, the per-layer upstream gradient norms (DPN Fig. 2) and DTN's λ over training (DTN Fig. 4).

Intervals: forward measures pool every image of every seed (per-seed summaries pooled by
records.stats.pool; a t-interval over images), gradient norms pool the last `grad_last` steps of every seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..records.stats import Estimate, estimate
from .diagnostics_data import DEPTH_MEASURES, collect, depth_curves, first_part, upstream_logs
from .diagnostics_figures import FIGURES
from .formats import to_markdown
from .kinds import Report
from .tables import Cellv, TaskTable

DECIMALS = {
    "patch_cosine": 3,
    "attn_std": 4,
    "token_norm": 2,
    "attn_distance": 2,
    "attn_distance_patches": 3,
    "grad_norm": 3,
}


def _table(task: str, versions: list, dataset: str, metric: str, columns: list, **more) -> TaskTable:
    """A diagnostics table: one dataset's measure per column, no group columns, no better or worse (`mode` none)."""
    return TaskTable(
        task=task,
        protocol_versions=versions,
        metric=metric,
        mode="none",
        columns=columns,
        group_columns=[],
        setting=dataset,
        **more,
    )


def tables(records: list[dict], reference: str | None = None) -> list[TaskTable]:
    """One table per (task, dataset, measure): rows backbones, columns layers L0 ..; then the DTN statistics per
    norm and head, and the DPN stem scale per channel. Diagnostics describe; they mark no winner (no bold)."""
    out = []
    for (task, ds), t in sorted(collect(records).items(), key=lambda kv: (kv[0][0], kv[1]["order"], kv[0][1])):
        versions = sorted(t["versions"])
        for key, curves in depth_curves(t).items():
            depth = max(len(m) for m, _, _ in curves.values())
            cols = [f"L{i}" for i in range(depth)]
            what = "images" if key != "grad_norm" else "steps"
            table = _table(
                task,
                versions,
                ds,
                DEPTH_MEASURES[key],
                cols,
                decimals=DECIMALS[key],
                pixels=dict(t["pixels"]),
                footnote=f"Cells: mean ± 95% CI half-width (t-interval over the {what} of all seeds); "
                "seeds: how many were pooled.",
            )
            for b, (mean, ci, n) in curves.items():
                table.rows[b] = {c: Cellv(estimate(m, e, n)) for c, m, e in zip(cols, mean, ci)}
                table.seeds[b] = str(len(t["gradients" if key == "grad_norm" else "forward"][b]))
            out.append(table)
        out += _upstream_tables(task, ds, versions, t)
        out += _dtn_tables(task, ds, versions, t) + _stem_tables(task, ds, versions, t)
    return out


def _upstream_tables(task, ds, versions, t) -> list[TaskTable]:
    logs = upstream_logs(t)
    if not logs:
        return []
    depth = max(len(u["grad_norm_last"]) for u in logs.values())
    cols = ["embed", *[f"L{i}" for i in range(depth)]]
    table = _table(
        task,
        versions,
        ds,
        "upstream gradient norm per layer (pretraining's last steps)",
        cols,
        decimals=3,
        footnote="The L2 norm of each block's (and the patch embedding's) parameter gradients, before "
        "clipping, averaged over the last steps of the checkpoint's upstream training (DPN "
        "Fig. 2: the last 1,000); seeds: how many steps were averaged.",
    )
    for b, u in logs.items():
        vals = [u["embed_grad_norm_last"], *u["grad_norm_last"]]
        table.rows[b] = {c: Cellv(Estimate(float(v), None, 1)) for c, v in zip(cols, vals)}
        table.seeds[b] = str(u["last"])
    return [table]


def _dtn_tables(task, ds, versions, t) -> list[TaskTable]:
    out = []
    for b, parts in sorted(t["forward"].items()):
        norms = first_part(parts, "dtn")
        if not norms:
            continue
        heads = len(norms[0]["width"])
        cols = [f"{what} h{h}" for what in ("λμ", "λσ", "width") for h in range(heads)]
        table = _table(
            task,
            versions,
            ds,
            f"DTN per norm and head of {b}",
            cols,
            decimals=3,
            row_label="block.norm",
            footnote="λμ = sigmoid(mix_mean), λσ = sigmoid(mix_var) (1: LayerNorm's statistics, 0: "
            "the positional kernel's); width: the kernel's mean distance in pixels.",
        )
        for n in norms:
            vals = [*n["lambda_mean"], *n["lambda_var"], *n["width"]]
            table.rows[n["name"]] = {c: Cellv(Estimate(float(v), None, 1)) for c, v in zip(cols, vals)}
            table.seeds[n["name"]] = "1"
        out.append(table)
    return out


def _stem_tables(task, ds, versions, t) -> list[TaskTable]:
    rows = {}
    for b, parts in sorted(t["forward"].items()):
        maps = first_part(parts, "stem_scale_maps")
        if maps is not None:
            rows[b] = np.asarray(maps)
    if not rows:
        return []
    channels = min(m.shape[0] for m in rows.values())
    cols = [f"{c} {s}" for c in "RGB"[:channels] for s in ("mean", "min", "max")]
    table = _table(
        task,
        versions,
        ds,
        "stem LayerNorm scale per colour channel",
        cols,
        decimals=3,
        footnote="The first LayerNorm's scale over the p x p pixels of each channel (the maps are in the figure).",
    )
    for b, m in rows.items():
        vals = [f(m[c]) for c in range(channels) for f in (np.mean, np.min, np.max)]
        table.rows[b] = {c: Cellv(Estimate(float(v), None, 1)) for c, v in zip(cols, vals)}
        table.seeds[b] = "1"
    return [table]


def figures(records: list[dict], folder: Path, stem: str) -> list[tuple[str, str, Path]]:
    """Every figure of every (task, dataset) into `folder` as `{stem}_{task}_{dataset}_{kind}.png`; returns
    (dataset, caption, path) for each written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for (task, ds), t in sorted(collect(records).items(), key=lambda kv: (kv[0][0], kv[1]["order"], kv[0][1])):
        for kind, fn, caption in FIGURES:
            path = fn(t, f"{task} / {ds}", folder / f"{stem}_{task}_{ds}_{kind}.png")
            if path is not None:
                out.append((ds, caption, path))
    return out


def leaderboard_section(records: list[dict], tables_: list, task: str, out) -> list[str]:
    """Per dataset: the figures, then a table per measure."""
    lines = []
    pngs = figures(records, out.parent, out.stem)
    for dataset in dict.fromkeys(x.setting.split(";")[0] for x in tables_):
        lines += [f"### {dataset}", ""]
        lines += [f"![{caption}, {dataset}]({png.name})\n" for d, caption, png in pngs if d == dataset]
        lines += [to_markdown(x, title=False) for x in tables_ if x.setting.split(";")[0] == dataset]
    return lines


KIND = Report(
    tables, section=leaderboard_section, uses_reference=False
)  # entry point transferbench.reports: diagnostics
