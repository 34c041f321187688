"""The overview: one row per backbone, one column per task's headline (the DPN paper's order), each cell the
row's mean ± 95% CI and its paired difference from the row's reference; then, per backbone, wins / ties /
losses against its reference over every (task, dataset, setting) the records hold — "often improves, never
hurts" made checkable — with the losses named.

A headline reads one column of one of a task's tables (`HEADLINES`); where a task has one table per dataset
(ImageNet-C), the datasets' values are averaged (records.stats.suite_mean, as the task's seed_scope says) and
paired alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tabulate import tabulate

from ..records.stats import holm, suite_mean
from ..spec import seeds_shared
from .formats import estimate_text, mark, mde_text
from .tables import Cellv, TaskTable, _judge, _paired

PAPER_ORDER = ("vtab", "fewshot", "lit", "ade20k", "imagenet_c", "hires")  # then other tasks; diagnostics last
LAST = ("diagnose",)


def task_order(tasks) -> list[str]:
    """Tasks in the paper's order (VTAB-1k, few-shot, LiT, ADE20K, ImageNet-C, high-res), then any other task by
    name, the diagnostics last."""
    tasks = set(tasks)
    rest = sorted(t for t in tasks if t not in PAPER_ORDER and t not in LAST)
    return [t for t in PAPER_ORDER if t in tasks] + rest + [t for t in LAST if t in tasks]


def _column(*names: str, suffix: str = "") -> Callable[[TaskTable], str | None]:
    """The first of `names` that `t` has as a column; a one-dataset group (VTAB's structured with one embedded
    set) reads its dataset; failing all, the only column ending in `suffix` (a task with one dataset)."""

    def pick(t: TaskTable) -> str | None:
        for n in names:
            if n in t.columns:
                return n
            if len(t.members.get(n, [])) == 1:
                return t.members[n][0]
        if suffix is not None:
            data = [c for c in t.columns if c not in t.group_columns and c.endswith(suffix)]
            if len(data) == 1:
                return data[0]
        return None

    return pick


@dataclass(frozen=True)
class Headline:
    task: str
    label: str
    column: Callable[[TaskTable], str | None]
    table: str = "first"  # first: the headline setting (most shots, full fraction); last: the smallest; all


HEADLINES = (
    Headline("vtab", "VTAB-1k mean", _column("mean")),
    Headline("vtab", "natural", _column("natural", suffix=None)),
    Headline("vtab", "specialized", _column("specialized", suffix=None)),
    Headline("vtab", "structured", _column("structured", suffix=None)),
    Headline("fewshot", "few-shot mean", _column("mean")),
    Headline("lit", "LiT zero-shot", _column("zeroshot", suffix=None)),
    Headline("ade20k", "ADE20K mIoU", _column("mean")),
    Headline("ade20k", "ADE20K mIoU, smallest fraction", _column("mean"), table="last"),
    Headline("imagenet_c", "ImageNet-C mCE ↓", _column("mCE", suffix=None), table="all"),
    Headline("hires", "high-res gain", _column("mean gain", suffix=" gain")),
)


def _settings_label(t: TaskTable) -> str:
    return f" ({t.setting})" if t.setting and t.axes else ""


def headline_cells(tables: list[TaskTable], refs_of: Callable[[str], dict]) -> list[tuple[str, dict[str, Cellv], str]]:
    """(column label, backbone -> value with its paired difference, mode) per headline that the tables have.
    `refs_of(task)` gives the task's stem pairs."""
    out = []
    by_task: dict[str, list[TaskTable]] = {}
    for t in tables:
        by_task.setdefault(t.task, []).append(t)
    heads = list(HEADLINES) + [
        Headline(task, f"{task} mean", _column("mean"))
        for task in task_order(by_task)
        if task not in PAPER_ORDER and task not in LAST
    ]
    for h in heads:
        ts = [t for t in by_task.get(h.task, []) if t.refs is not None and t.mode in ("max", "min")]
        if not ts:
            continue
        chosen = ts if h.table == "all" else [ts[0] if h.table == "first" else ts[-1]]
        if h.table == "last" and len(ts) < 2:
            continue  # one setting only: the first headline says it already
        cols = [(t, h.column(t)) for t in chosen]
        cols = [(t, c) for t, c in cols if c is not None]
        if not cols:
            continue
        datasets = {t.setting.split(";")[0] for t, _ in cols}  # ImageNet-C: a table per dataset (and reference)
        values: dict[str, Cellv] = {}
        for b in sorted({b for t, c in cols for b in t.rows if c in t.rows[b]}):
            have = [(t, c) for t, c in cols if c in t.rows.get(b, {})]
            if len(have) != len(datasets):
                continue  # missing a dataset: no comparable mean
            cells = [t.rows[b][c] for t, c in have]
            values[b] = (
                cells[0]
                if len(cells) == 1
                else _combine(cells, [f"{t.setting.split(';')[0]}/{c}" for t, c in have], h.task)
            )
        refs = refs_of(h.task)
        for b, v in values.items():
            v = Cellv(v.estimate, seeds=v.seeds, samples=v.samples, shared=v.shared)
            r = refs.get(b)
            if r in values:
                v.delta = _paired(v, values[r])
                v.better, v.worse = _judge(v.delta, cols[0][0].mode)
            values[b] = v
        label = h.label + (_settings_label(chosen[0]) if len(chosen) == 1 else "")
        out.append((label, values, cols[0][0].mode))
    return out


def _combine(cells: list[Cellv], names: list[str], task: str) -> Cellv:
    """The mean of several datasets' values (each over seeds) as a suite mean of `task` (records.stats.suite_mean,
    as the task's `seed_scope` says)."""
    seeds = {}
    for name, v in zip(names, cells):
        if isinstance(next(iter(v.seeds.values())), dict):
            seeds.update({f"{name}/{k}": x for k, x in v.seeds.items()})
        else:
            seeds[name] = v.seeds
    shared = seeds_shared(task)
    return Cellv(suite_mean(seeds, shared=shared), seeds=seeds, shared=shared)


def overview_cell(v: Cellv | None, is_ref: bool, decimals: int = 1) -> str:
    if v is None or v.estimate is None:
        return "—"
    own = estimate_text(v.estimate, decimals=decimals)
    if is_ref or v.delta is None:
        return own
    d = v.delta
    if v.better or v.worse:
        return mark(f"{own} (Δ {estimate_text(d, signed=True, decimals=decimals)})", v)
    return f"{own} (Δ {d.mean:+.{decimals}f}, {mde_text(d, decimals)})"


@dataclass
class Tally:
    wins: list
    ties: list
    losses: list
    untested: list


def tally(tables: list[TaskTable], correct: bool = False) -> dict[str, Tally]:
    """Per compared backbone: its wins, ties and losses against its reference over every (task, dataset, setting)
    the tables hold (`t.tally` columns, default every dataset column). With `correct`, Holm–Bonferroni over each
    backbone's comparisons (their paired t-tests' p-values) decides instead of the per-comparison interval."""
    found: dict[str, list] = {}
    for t in tables:
        if t.mode not in ("max", "min"):
            continue
        cols = t.tally if t.tally is not None else [c for c in t.columns if c not in t.group_columns]
        for b, r in t.refs.items():
            for c in cols:
                v = t.rows[b].get(c)
                if v is None or v.delta is None:
                    continue
                where = f"{t.task} {t.setting.split(';')[0] + ' ' if t.setting else ''}{c}".replace("  ", " ")
                found.setdefault(b, []).append((where, v, t.mode, r))
    out = {}
    for b, items in found.items():
        if correct:
            reject = holm([v.delta.p for _, v, _, _ in items])
        else:
            reject = [v.better or v.worse for _, v, _, _ in items]
        res = Tally([], [], [], [])
        for (where, v, mode, _r), rej in zip(items, reject):
            d = v.delta
            if d.ci is None and d.p is None:
                res.untested.append(where)
            elif not rej:
                res.ties.append(where)
            elif (d.mean > 0) == (mode == "max"):
                res.wins.append(where)
            else:
                res.losses.append(f"{where} {d.mean:+.1f} ± {d.ci:.1f}" if d.ci is not None else where)
        out[b] = res
    return out


def overview_markdown(tables: list[TaskTable], refs_of: Callable[[str], dict], correct: bool = False) -> list[str]:
    """The overview table and the wins / ties / losses list, as markdown lines."""
    heads = headline_cells(tables, refs_of)
    if not heads:
        return ["No task with a headline metric has records.", ""]
    backbones = []
    refs = {}
    for task in task_order({t.task for t in tables}):
        refs.update(refs_of(task))
    for r in sorted(set(refs.values())):
        backbones += [r] + sorted(b for b, x in refs.items() if x == r and b not in refs.values())
    backbones += sorted({b for _, vals, _ in heads for b in vals} - set(backbones))
    backbones = list(dict.fromkeys(backbones))
    body = []
    for b in backbones:
        name = b + (" (ref)" if b in refs.values() else f" vs {refs[b]}" if b in refs else "")
        body.append([name, *(overview_cell(vals.get(b), b not in refs) for _, vals, _ in heads)])
    lines = [
        tabulate(body, ["backbone", *(label for label, _, _ in heads)], tablefmt="github", disable_numparse=True),
        "",
        "Each cell: the backbone's mean ± 95% CI; in brackets its paired difference from the row's reference "
        "(the plain backbone of the same weights source). Bold / italic: significantly better / worse (95% "
        "interval excludes 0); n.s.: not significant, and the MDE is the smallest true difference its seeds "
        "would detect (95% confidence, 80% power; paired t): a tie is a tie only for effects above it. "
        "↓: lower is better. —: no records.",
        "",
    ]
    counts = tally(tables, correct)
    if counts:
        how = (
            "Holm–Bonferroni over each backbone's comparisons (family-wise 5%)"
            if correct
            else "each comparison's 95% interval, not corrected for multiple comparisons"
        )
        lines += [
            f"Wins / ties / losses against the reference over every (task, dataset, setting) — judged by {how}:",
            "",
        ]
        rows, named = [], []
        untested = any(x.untested for x in counts.values())
        for b in backbones:
            if b not in counts:
                continue
            c = counts[b]
            rows.append(
                [f"{b} vs {refs.get(b, '?')}", len(c.wins), len(c.ties), len(c.losses)]
                + ([len(c.untested)] if untested else [])
            )
            if c.losses:
                named.append(f"- losses of {b}: " + "; ".join(c.losses))
        head = ["backbone", "wins", "ties", "losses"] + (["untested (one seed)"] if untested else [])
        lines += [tabulate(rows, head, tablefmt="github", disable_numparse=True), "", *named, ""]
    return lines


__all__ = [
    "HEADLINES",
    "PAPER_ORDER",
    "Headline",
    "Tally",
    "headline_cells",
    "overview_markdown",
    "tally",
    "task_order",
]
