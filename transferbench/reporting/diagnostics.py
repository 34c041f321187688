"""Diagnostics reports: a table per measure (rows backbones, columns layers: mean ± 95% CI) and the figures —
measure vs depth with one line per backbone and a 95% band, mean attention distance per head against depth (the
ViT / ConViT scatter), DPN's stem scale maps as images, DTN's mixing weights and kernel widths per head and its
kernels P^h as maps, the patch embedding's gradient norm over the fine-tuning steps, and, for checkpoints whose
pretraining logged them, the per-layer upstream gradient norms (DPN Fig. 2) and DTN's λ over training (DTN Fig. 4).

Intervals: forward measures pool every image of every seed (per-seed summaries pooled by
records.stats.pool; a t-interval over images), gradient norms pool the last `grad_last` steps of every seed.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from ..cell import DIAGNOSTICS_REPORT
from ..records.record import latest
from ..records.stats import Estimate, estimate, half_width, pool
from .figures import colour, finish, pyplot
from .formats import to_markdown
from .kinds import Report
from .tables import Cellv, TaskTable

DEPTH_MEASURES = {  # key -> title
    "patch_cosine": "patch cosine similarity",
    "attn_std": "attention row std",
    "token_norm": "token norm",
    "attn_distance": "mean attention distance (px, mean over heads)",
    "attn_distance_patches": "mean attention distance (patches, mean over heads)",
    "grad_norm": "gradient norm (last fine-tuning steps)",
}
DECIMALS = {
    "patch_cosine": 3,
    "attn_std": 4,
    "token_norm": 2,
    "attn_distance": 2,
    "attn_distance_patches": 3,
    "grad_norm": 3,
}


def is_diagnostics(record: dict) -> bool:
    return record.get("report") == DIAGNOSTICS_REPORT


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


def collect(records: list[dict]) -> dict:
    """(task, dataset) -> {"order", "versions", "forward": backbone -> [diag per seed], "gradients": same}; the
    latest record of a (backbone, seed, stage) wins."""
    newest = {}
    for r in latest(records):
        if r["status"] == "ok" and is_diagnostics(r):
            newest[(r["task"], r["dataset"], r["backbone"], r["stage"], int(r["seed"]))] = r
    out: dict = {}
    for (task, ds, b, stage, _seed), r in sorted(newest.items()):
        t = out.setdefault(
            (task, ds),
            {
                "order": r.get("order", 0),
                "versions": set(),
                "pixels": defaultdict(set),
                "forward": defaultdict(list),
                "gradients": defaultdict(list),
            },
        )
        t["versions"].add(r["protocol_version"])
        if r["hparams"].get("pixels"):
            t["pixels"][b].add(r["hparams"]["pixels"])
        t[stage][b].append(r["info"]["diagnostics"])
    return out


def pooled(parts: list[dict], key: str) -> dict | None:
    """A measure pooled over seeds: {"mean", "sd", "n", "ci"} arrays (ci: 95% t half-width)."""
    have = [p[key] for p in parts if key in p]
    if not have:
        return None
    return pool(have)


def depth_curves(t: dict) -> dict:
    """measure -> backbone -> (mean per layer, ci per layer, n); attention distance averaged over heads (its
    interval: the heads' intervals averaged, a conservative band)."""
    out: dict = defaultdict(dict)
    for key in DEPTH_MEASURES:
        stage = "gradients" if key == "grad_norm" else "forward"
        for b, parts in sorted(t[stage].items()):
            p = pooled(parts, key)
            if p is None:
                continue
            mean, ci = np.asarray(p["mean"]), np.asarray(p["ci"])
            if mean.ndim == 2:  # per layer and head
                mean, ci = mean.mean(axis=1), ci.mean(axis=1)
            out[key][b] = (mean, ci, p["n"])
    return out


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


def _upstream(t: dict) -> dict:
    """backbone -> the training log of its checkpoint's pretraining (`upstream`), for those that have one."""
    return {b: u for b, parts in sorted(t["forward"].items()) if (u := _first(parts, "upstream"))}


def _upstream_tables(task, ds, versions, t) -> list[TaskTable]:
    logs = _upstream(t)
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


def _first(parts: list[dict], key: str):
    """A weight measure (the same for every seed of a checkpoint; seed 0's for random-init)."""
    return next((p[key] for p in parts if p.get(key)), None)


def _dtn_tables(task, ds, versions, t) -> list[TaskTable]:
    out = []
    for b, parts in sorted(t["forward"].items()):
        norms = _first(parts, "dtn")
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
        maps = _first(parts, "stem_scale_maps")
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


# --- figures ----------------------------------------------------------------------------------------------


def _colours(backbones) -> dict:
    return {b: colour(b) for b in sorted(backbones)}


def plot_depth(t: dict, title: str, path: Path) -> Path | None:
    """Each depth measure against the layer, one line per backbone, 95% band."""
    plt = pyplot()
    curves = depth_curves(t)
    if "attn_distance_patches" in curves:  # the figure in patches, as the DTN paper reports it (px in the table)
        curves.pop("attn_distance", None)
    if not curves:
        return None
    colours = _colours({b for c in curves.values() for b in c})
    fig, axes = plt.subplots(1, len(curves), figsize=(3.1 * len(curves), 3.0))
    for ax, (key, per) in zip(np.atleast_1d(axes), curves.items()):
        for b, (mean, ci, _) in per.items():
            xs = np.arange(len(mean))
            ax.plot(xs, mean, marker="o", ms=3, color=colours[b], label=b)
            if np.all(np.isfinite(ci)):
                ax.fill_between(xs, mean - ci, mean + ci, color=colours[b], alpha=0.2, lw=0)
        ax.set_title(DEPTH_MEASURES[key], fontsize=8)
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: per layer, mean and 95% band", fontsize=9)
    return finish(fig, path, np.atleast_1d(axes)[-1])


def plot_attention_distance(t: dict, title: str, path: Path) -> Path | None:
    """Mean attention distance of every head against its layer (ViT Fig. 7), in patches as the DTN paper reports
    it (pixels for records that predate it): a dot per head, a colour per backbone."""
    plt = pyplot()
    parts_of = sorted(t["forward"].items())
    unit = "patches" if all("attn_distance_patches" in p for _, parts in parts_of for p in parts) else "px"
    key = "attn_distance_patches" if unit == "patches" else "attn_distance"
    per = {b: pooled(parts, key) for b, parts in parts_of}
    per = {b: np.asarray(p["mean"]) for b, p in per.items() if p is not None}
    if not per:
        return None
    colours = _colours(per)
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for i, (b, d) in enumerate(per.items()):
        layers, heads = d.shape
        xs = np.repeat(np.arange(layers), heads) + (i - (len(per) - 1) / 2) * 0.12
        ax.scatter(xs, d.reshape(-1), s=12, color=colours[b], label=b, alpha=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"mean attention distance ({unit})")
    ax.grid(alpha=0.3)
    ax.set_title(f"{title}: mean attention distance per head", fontsize=9)
    return finish(fig, path, ax)


def plot_stem_maps(t: dict, title: str, path: Path) -> Path | None:
    """The stem LayerNorm's scale as p x p images, one per colour channel, a row per backbone that has one."""
    plt = pyplot()
    rows = {
        b: np.asarray(m)
        for b, parts in sorted(t["forward"].items())
        if (m := _first(parts, "stem_scale_maps")) is not None
    }
    if not rows:
        return None
    channels = max(m.shape[0] for m in rows.values())
    fig, axes = plt.subplots(len(rows), channels, figsize=(2.3 * channels + 0.6, 2.2 * len(rows)), squeeze=False)
    for r, (b, maps) in enumerate(rows.items()):
        lo, hi = float(maps.min()), float(maps.max())
        for c in range(channels):
            ax = axes[r][c]
            im = ax.imshow(maps[c], cmap="viridis", vmin=lo, vmax=hi)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{b}: {'RGB'[c] if channels == 3 else c}", fontsize=7)
        fig.colorbar(im, ax=list(axes[r]), fraction=0.04)
    fig.suptitle(f"{title}: stem LayerNorm scale per pixel of the patch", fontsize=9)
    return finish(fig, path, tight=False)  # the colour bars are placed by hand


def plot_dtn(t: dict, title: str, path: Path) -> Path | None:
    """DTN's λμ, λσ and kernel width per head against the layer, a colour per backbone."""
    plt = pyplot()
    rows = {b: n for b, parts in sorted(t["forward"].items()) if (n := _first(parts, "dtn"))}
    if not rows:
        return None
    colours = _colours(rows)
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.0))
    for i, (b, norms) in enumerate(rows.items()):
        for n_i, n in enumerate(norms):
            layer = int(n["name"].split(".")[0]) + (0.25 if n["name"].endswith("norm2") else 0.0)
            for ax, key in zip(axes, ("lambda_mean", "lambda_var", "width")):
                v = n[key]
                ax.scatter([layer + i * 0.06] * len(v), v, s=12, color=colours[b], label=b if n_i == 0 else None)
    for ax, label in zip(axes, ("λμ = sigmoid(mix_mean)", "λσ = sigmoid(mix_var)", "kernel width (px)")):
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("layer (norm1; norm2 at +0.25)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: DTN per head (λ = 1: LayerNorm's statistics; 0: the positional kernel's)", fontsize=9)
    return finish(fig, path, axes[-1])


def plot_embed_grad(t: dict, title: str, path: Path) -> Path | None:
    """The patch embedding's gradient norm at every fine-tuning step, mean and 95% band over seeds."""
    plt = pyplot()
    series = {b: np.asarray([p["embed_grad_norm_steps"] for p in parts]) for b, parts in sorted(t["gradients"].items())}
    if not series:
        return None
    colours = _colours(series)
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    for b, s in series.items():
        mean = s.mean(axis=0)
        xs = np.arange(len(mean))
        ax.plot(xs, mean, color=colours[b], label=b)
        if len(s) > 1:
            ci = half_width(s.std(axis=0, ddof=1), len(s))
            ax.fill_between(xs, mean - ci, mean + ci, color=colours[b], alpha=0.2, lw=0)
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel("patch embedding gradient norm")
    ax.set_ylim(bottom=0)  # step 0: the zero-initialised head passes no gradient back to the stem
    ax.grid(alpha=0.3)
    ax.set_title(f"{title}: patch embedding gradient norm (before clipping)", fontsize=9)
    return finish(fig, path, ax)


def plot_upstream(t: dict, title: str, path: Path) -> Path | None:
    """From the checkpoints' training logs: the per-layer gradient norm over the last upstream steps (DPN Fig. 2),
    the patch embedding's gradient norm over training, and DTN's λ (mean over heads) over training (DTN Fig. 4)."""
    plt = pyplot()
    logs = _upstream(t)
    if not logs:
        return None
    colours = _colours(logs)
    with_dtn = {b: u for b, u in logs.items() if u.get("dtn_lambda")}
    fig, axes = plt.subplots(1, 3 if with_dtn else 2, figsize=(11.0 if with_dtn else 7.4, 3.1))
    for b, u in logs.items():
        axes[0].plot(range(len(u["grad_norm_last"])), u["grad_norm_last"], marker="o", ms=3, color=colours[b], label=b)
        axes[1].plot(u["embed_grad_norm"]["step"], u["embed_grad_norm"]["value"], color=colours[b], label=b)
    axes[0].set(xlabel="layer", title=f"gradient norm, last {min(u['last'] for u in logs.values())} upstream steps")
    axes[1].set(xlabel="upstream step", title="patch embedding gradient norm")
    axes[1].set_ylim(bottom=0)
    for b, u in with_dtn.items():
        steps = [e["step"] for e in u["dtn_lambda"]]
        norms = [n["name"] for n in u["dtn_lambda"][0]["norms"]]
        for k, _name in enumerate(norms):
            mean = [np.mean(e["norms"][k]["lambda_mean"]) for e in u["dtn_lambda"]]
            var = [np.mean(e["norms"][k]["lambda_var"]) for e in u["dtn_lambda"]]
            shade = 0.35 + 0.65 * (k + 1) / len(norms)
            axes[2].plot(steps, mean, color=colours[b], alpha=shade)
            axes[2].plot(steps, var, color=colours[b], alpha=shade, ls="--")
        axes[2].set(xlabel="upstream step", title="DTN λ per norm (mean over heads; darker: deeper)")
    for b in logs:  # one legend for the three panels: a colour per backbone, a line style per λ
        axes[-1].plot([], [], color=colours[b], label=b)
    if with_dtn:
        axes[-1].plot([], [], color="k", label="λμ (mean)")
        axes[-1].plot([], [], color="k", ls="--", label="λσ (variance)")
    for ax in axes:
        ax.title.set_fontsize(8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: what upstream training logged", fontsize=9)
    return finish(fig, path, axes[-1])


def plot_dtn_kernels(t: dict, title: str, path: Path) -> Path | None:
    """DTN's positional kernels P^h as maps (DTN Figs. 7-8): the weight the centre token gives each position, a
    column per head, a row per norm (up to 4 per backbone)."""
    plt = pyplot()
    rows = [(b, k) for b, parts in sorted(t["forward"].items()) for k in (_first(parts, "dtn_kernels") or [])[:4]]
    if not rows:
        return None
    heads = max(len(k["maps"]) for _, k in rows)
    fig, axes = plt.subplots(len(rows), heads, figsize=(1.9 * heads + 0.6, 1.8 * len(rows)), squeeze=False)
    for r, (b, k) in enumerate(rows):
        maps = np.asarray(k["maps"])
        for h in range(heads):
            ax = axes[r][h]
            ax.set_xticks([])
            ax.set_yticks([])
            if h < len(maps):
                im = ax.imshow(maps[h], cmap="magma", vmin=0, vmax=float(maps.max()))
                ax.set_title(f"{b} {k['name']} h{h}", fontsize=6)
        fig.colorbar(im, ax=list(axes[r]), fraction=0.04)
    fig.suptitle(f"{title}: DTN positional kernels P^h seen from the centre token", fontsize=9)
    return finish(fig, path, tight=False)


FIGURES = (
    ("depth", plot_depth, "measures vs depth"),
    ("distance", plot_attention_distance, "attention distance per head"),
    ("stem", plot_stem_maps, "DPN stem scale maps"),
    ("dtn", plot_dtn, "DTN mixing weights and widths"),
    ("dtn_kernels", plot_dtn_kernels, "DTN positional kernels"),
    ("embed_grad", plot_embed_grad, "patch embedding gradient norm (fine-tuning)"),
    ("upstream", plot_upstream, "upstream gradient norms and DTN λ over pretraining"),
)


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
