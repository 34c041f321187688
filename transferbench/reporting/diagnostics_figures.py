"""The diagnostics report's figures (reporting.diagnostics), each of one (task, dataset)'s measures: measure vs depth
with one line per backbone and a 95% band, mean attention distance per head against depth, DPN's stem scale maps,
DTN's mixing weights, widths and kernels, the patch embedding's gradient norm over fine-tuning, and the upstream
gradient norms and DTN's λ over pretraining."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..records.stats import half_width
from .diagnostics_data import DEPTH_MEASURES, depth_curves, first_part, pooled, upstream_logs
from .figures import colour, finish, pyplot


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
        if (m := first_part(parts, "stem_scale_maps")) is not None
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
    rows = {b: n for b, parts in sorted(t["forward"].items()) if (n := first_part(parts, "dtn"))}
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
    logs = upstream_logs(t)
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
    rows = [(b, k) for b, parts in sorted(t["forward"].items()) for k in (first_part(parts, "dtn_kernels") or [])[:4]]
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
