"""What every report figure shares: matplotlib without a display, one colour per backbone across every figure,
the legend outside the axes (never over a point), and PNG plus SVG written with nothing clipped."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed: CI, clusters)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_ORDER: list[str] = []  # backbones in the order they got their colours


def use_colours(backbones) -> None:
    """Fix each backbone's colour for every figure that follows (a leaderboard calls it once with all its
    backbones, so a backbone has one colour in every figure)."""
    _ORDER[:] = list(dict.fromkeys(sorted(backbones)))


def colour(backbone: str) -> str:
    """The backbone's colour: its place among `use_colours`' backbones (new ones appended) in matplotlib's tab10
    palette, tab20 beyond 10 backbones."""
    import matplotlib

    if backbone not in _ORDER:
        _ORDER.append(backbone)
    i = _ORDER.index(backbone)
    cmap = matplotlib.colormaps["tab10" if len(_ORDER) <= 10 else "tab20"]
    return matplotlib.colors.to_hex(cmap(i % cmap.N))


VECTOR = ".svg"  # every figure is also written in this vector format beside its PNG


def finish(
    fig, path: Path, legend_ax=None, *, dpi: int = 110, fontsize: int = 7, gap: float = 1.02, tight: bool = True
) -> Path:
    """The legend of `legend_ax` to the right of it, a tight layout, `path` (PNG) and its SVG twin written with
    every title, label and legend inside the saved area, the figure closed."""
    if legend_ax is not None:
        legend_ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(gap, 1.0))
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi, bbox_inches="tight")  # the saved area grows to hold titles and outside legends
    # the same figure gives the same bytes: no date in the SVG, and its element ids from a fixed salt
    with pyplot().rc_context({"svg.hashsalt": "transferbench"}):
        fig.savefig(Path(path).with_suffix(VECTOR), bbox_inches="tight", metadata={"Date": None})
    pyplot().close(fig)
    return path


def plot_deltas(t, path: Path, own_axis: tuple = ()) -> Path | None:
    """Each compared backbone's paired difference from its reference (table `t`, a tables.TaskTable) per column,
    with its 95% interval; the columns in `own_axis` (relative mCE, whose range dwarfs the others) on an axis of
    their own. None where nothing is compared."""
    plt = pyplot()
    if not t.refs:
        return None
    main = [c for c in t.columns if c not in own_axis]
    side = [c for c in t.columns if c in own_axis and any(c in t.rows[b] for b in t.refs)]
    if side:
        fig, (ax, ax2) = plt.subplots(
            1,
            2,
            figsize=(max(5.0, 0.9 * len(main) + 3), 3.6),
            gridspec_kw={"width_ratios": [max(len(main), 1), len(side) + 0.6]},
        )
    else:
        fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(main) + 2), 3.6))
        ax2 = None
    width = 0.8 / len(t.refs)
    several = len(t.references) > 1
    for axis, cols in ((ax, main), (ax2, side)):
        if axis is None:
            continue
        for i, (b, r) in enumerate(t.refs.items()):
            xs, ys, errs = [], [], []
            for j, col in enumerate(cols):
                v = t.rows[b].get(col)
                if v is not None and v.delta is not None:
                    xs.append(j - 0.4 + width * (i + 0.5))
                    ys.append(v.delta.mean)
                    errs.append(v.delta.ci or 0.0)
            axis.errorbar(xs, ys, yerr=errs, fmt="o", capsize=3, color=colour(b), label=f"{b} − {r}")
        axis.axhline(0, color="grey", lw=0.8)
        for j, col in enumerate(cols):
            if col in t.group_columns:
                axis.axvspan(j - 0.5, j + 0.5, color="0.93", zorder=0)  # group means on a grey background
        axis.set_xticks(range(len(cols)))
        axis.set_xticklabels(cols, rotation=30, ha="right")
    ax.set_ylabel(f"Δ {t.metric}" + ("" if several else f" vs {t.reference}"))
    if ax2 is not None:
        ax2.set_ylabel(f"Δ {', '.join(side)}")
    ax.set_title(
        f"{t.task}{' (' + t.setting + ')' if t.setting else ''}: paired difference, 95% CI over seeds",
        fontsize=9,
        loc="left",
    )
    return finish(fig, path, ax2 if ax2 is not None else ax, dpi=120, fontsize=8, gap=1.01)


def plot_absolute(tables: list, path: Path) -> Path | None:
    """The curve a paper shows beside the differences: a task's headline value (its mean over datasets, or its
    one dataset) against its report axis (few-shot shots, ADE20K's training fraction), one line per backbone
    with its 95% band. None unless the tables differ in one numeric axis."""
    keys = {k for t in tables for k in t.axes}
    if len(tables) < 2 or len(keys) != 1:
        return None
    (key,) = keys
    if not all(isinstance(t.axes.get(key), (int, float)) for t in tables):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    backbones = list(dict.fromkeys(b for t in tables for b in t.rows))
    for b in backbones:
        pts = []
        for t in tables:
            col = "mean" if "mean" in t.columns else next((c for c in t.columns if c not in t.group_columns), None)
            v = t.rows.get(b, {}).get(col)
            if v is not None and v.estimate is not None:
                pts.append((float(t.axes[key]), v.estimate.mean, v.estimate.ci or 0.0))
        if len(pts) < 2:
            continue
        pts.sort()
        x, y, ci = (np.array(v) for v in zip(*pts))
        ax.plot(x, y, marker="o", ms=3, color=colour(b), label=b)
        ax.fill_between(x, y - ci, y + ci, color=colour(b), alpha=0.15, lw=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({float(t.axes[key]) for t in tables}))
    ax.set_xticklabels([f"{v:g}" for v in sorted({float(t.axes[key]) for t in tables})])
    first = tables[0]
    what = "mean over datasets" if "mean" in first.columns else "its dataset"
    ax.set_xlabel(key)
    ax.set_ylabel(f"{first.metric} ({what})")
    ax.set_title(f"{first.task}: {first.metric} vs {key}, mean and 95% band over seeds", fontsize=9, loc="left")
    ax.grid(alpha=0.3)
    return finish(fig, path, ax, dpi=120, fontsize=8)
