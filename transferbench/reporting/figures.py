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
