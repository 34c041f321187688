"""What every report figure shares: matplotlib without a display, the legend outside the axes (never over a
point), and the file written and the figure closed."""
from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed: CI, clusters)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def finish(fig, path: Path, legend_ax=None, *, dpi: int = 110, fontsize: int = 7, gap: float = 1.02,
           tight: bool = True) -> Path:
    """The legend of `legend_ax` to the right of it, a tight layout, `path` written at `dpi`, the figure closed."""
    if legend_ax is not None:
        legend_ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(gap, 1.0))
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def plot_deltas(t, path: Path) -> Path | None:
    """Each backbone's paired difference from the reference of table `t` (a tables.TaskTable) per column, with
    its 95% interval; None where the table has no reference or nothing to compare."""
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
