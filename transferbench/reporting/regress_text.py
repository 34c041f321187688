"""The regression report's words and its sections of what one side lacks (reporting.regress): a cell's name and
setting in words, markdown tables and numbers, the cells that failed, the tasks and backbones dropped or absent,
non-finite values, consistent shifts, vanished metrics, records of other code, and cells only one side holds."""

from __future__ import annotations

import json
import math

from tabulate import tabulate

from ..gate.comparisons import Comparison, Kind
from ..gate.comparisons import Verdict as V
from ..gate.decide import Gate
from ..gate.keys import CellKey, value_text
from ..gate.match import ExactCell


def words(axes: dict) -> str:
    """Axes in words: `shots=25, lr=0.01`."""
    return ", ".join(f"{k}={value_text(v)}" for k, v in axes.items())


def setting(x: Comparison) -> str:
    """A cell comparison's stage and axes in words: `final lr=0.01`."""
    return " ".join(y for y in (x.stage, words(x.axes)) if y)


def cell_name(x: ExactCell) -> str:
    """`task / dataset / backbone stage axes seed N`."""
    k = x.key
    axes = f" {words(x.axes)}" if x.axes else ""
    return f"{k.task} / {k.dataset} / {k.backbone} {k.stage}{axes} seed {k.seed}".replace("  ", " ")


def key_text(k: CellKey) -> str:
    return f"{k.task} / {k.dataset} / {k.backbone} {k.stage} seed {k.seed}"


def md_table(rows, head) -> str:
    return tabulate(rows, head, tablefmt="github", disable_numparse=True)


def table_section(title: str, rows: list, head: list, *paragraphs: str) -> list[str]:
    """A report section: its heading, its paragraphs and its table of `rows` under `head`, each followed by a blank
    line; no section where there are no rows."""
    if not rows:
        return []
    return [f"## {title}", "", *(line for p in paragraphs for line in (p, "")), md_table(rows, head), ""]


def num(x: float | None, fmt: str = "+.2f") -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def p_text(p: float | None) -> str:
    return "untested" if p is None else f"{p:.2g}"


def first_50(lines: list[str]) -> list[str]:
    """A listing's first 50 lines, then how many more; a blank line ends it."""
    return lines[:50] + ([f"- ... and {len(lines) - 50} more"] if len(lines) > 50 else []) + [""]


def cell_list(cells, tail) -> list[str]:
    return first_50([f"- {cell_name(x)}{tail(x)}" for x in cells])


def failed_section(failed) -> list[str]:
    """The cells of current that failed, or diverged where the baseline did not."""
    rows = [
        [*(r["task"], r["dataset"], r["backbone"], r.get("stage", ""), r["seed"]), *(r["status"], r.get("reason", ""))]
        for r in failed
    ]
    head = ["task", "dataset", "backbone", "stage", "seed", "status", "reason"]
    return table_section("Failed in current (or diverged where the baseline's cell did not)", rows, head)


def dropped_sections(g: Gate) -> list[str]:
    """The baseline's failed cells and the comparisons no test could judge: each fails the night, listed."""
    lines: list[str] = []
    if g.baseline_failed:
        lines += [
            "## Failed in the baseline",
            "",
            "The baseline's latest record of these cells failed or diverged, so tonight's numbers have nothing to be "
            "compared with: each fails the night (rerun the baseline's cell, or re-anchor):",
            "",
        ]
        lines += first_50([f"- {key_text(k)}" for k in g.baseline_failed])
    untested = g.untested
    if untested:
        lines += [
            "## Untested",
            "",
            "No test could judge these comparisons (no noise model entry for their task, split, metric and kind; or "
            "one seed against seed variance without logged examples). Each fails the night unless "
            "`--allow-untested` is given:",
            "",
        ]
        lines += first_50(
            [
                f"- {x.task} / {x.dataset} / {x.backbone} {x.stage} {words(x.axes)}: {x.split} {x.metric}"
                + (" (bf16 against fp32)" if x.precision_changed else "")
                for x in untested
            ]
        )
    return lines


def _shift_section(g: Gate) -> list[str]:
    """The consistent shifts that fired or reached the level: each task and metric's sign test over every backbone."""
    shifts = [
        x for x in g.of(Kind.SHIFT) if x.verdict in (V.SHIFT, V.SEE_POOLED) or (x.p is not None and x.p < g.alpha)
    ]
    return table_section(
        "Consistent shifts",
        [[x.task, x.backbone, x.metric, x.n, num(x.change), p_text(x.p), x.verdict] for x in shifts],
        ["task", "backbone", "metric", "comparisons", "mean change", "p", "verdict"],
        "Comparisons of one task and metric, over every backbone, that moved one way more often than the noise "
        "model allows (the exact sign test, Holm with the broad tests), each change perhaps too small for its own "
        "test; it fails where their mean change passes a fifth of the floor. A comparison whose precision differs "
        "between the sides is expected to get worse as often as the model measured bf16 against fp32 doing so.",
    )


def missing_sections(g: Gate) -> list[str]:
    """Cells only one side holds (the first 50 of each), tasks and backbones absent, metrics vanished, and records
    kept from other code."""
    lines: list[str] = []
    if g.absent:
        lines += [
            "## Absent from current",
            "",
            "Every cell of these tasks and backbones of the baseline is missing "
            "(name one with `--allow-missing TASK[:BACKBONE]` to pass without it):",
            "",
        ]
        lines += [f"- {t} / {b}" for t, b in g.absent] + [""]
    lines += dropped_sections(g)
    if g.nonfinite:
        lines += [
            "## Non-finite values",
            "",
            "A metric that is NaN, infinite or `null` on either side fails the night:",
            "",
        ]
        lines += first_50(
            [
                f"- {k.task} / {k.dataset} / {k.backbone} {k.stage} seed {seed}: {k.split} {k.metric}"
                for k, seed in g.nonfinite
            ]
        )
    lines += _shift_section(g)
    if g.vanished:
        lines += ["## Vanished metrics", ""]
        lines += first_50([f"- {key_text(v.cell)}: {v.split} {v.metric}" for v in g.vanished])
    if g.stale:
        lines += [
            "## Kept from other code",
            "",
            "Records of current computed by other code than the rest of their task "
            "and backbone (`--stale keep`): not judged, counted as missing.",
            "",
        ]
        lines += first_50([f"- {key_text(k)}" for k in g.stale])
    for heading, keys in (("Missing from current", g.missing), ("New in current", g.new)):
        if keys:
            axes = lambda k: f" ({axes_words(k.axes)})" if k.axes != "{}" else ""  # noqa: E731
            lines += [f"## {heading}", ""]
            lines += first_50([f"- {key_text(k)}{axes(k)}" for k in keys])
    return lines


def axes_words(key: str) -> str:

    return words(json.loads(key))


def selection_text(s) -> str:
    ax = words(s.axes)
    cell = f"{s.task} / {s.dataset} / {s.backbone}{f' {ax}' if ax else ''} seed {s.seed}"
    return f"{cell}: {words(s.before)} → {words(s.after)}"
