"""Tables: one per task, a row per backbone, a column per dataset (+ group means), `mean ± ci`.

Two comparisons, never mixed in one table:
- the stem question (`stem_references`): each backbone beside the plain backbone of the same weights source
  (`mu4_dpn@embedded` with `mu4@embedded`, random-init `mu4_dtn` with random-init `mu4`), or the `--reference`
  a user names. A cell is **bold** when its paired per-seed difference from its reference is significantly
  better (95% interval excludes 0 on the better side, the DPN paper's Table 3 rule) and *italic* when it is
  significantly worse; a second table gives the differences, each with its minimum detectable effect.
- the sanity question (`sanity_references`): each checkpoint against random init of its own architecture
  (`mu4_dpn@embedded` with `mu4_dpn`): does the probe see pretraining at all?
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field

from ..errors import UserError, close_matches
from ..hashing import canon
from ..names import model_name, parse
from ..records.aggregate import Entry, value_order
from ..records.stats import Estimate, paired_bootstrap, paired_difference, paired_suite_difference, suite_mean
from ..spec import seeds_shared

ALL = "mean"  # the column averaging every dataset of a task


@dataclass
class Cellv:
    estimate: Estimate | None
    delta: Estimate | None = None  # the paired difference from the row's reference
    better: bool = False  # significantly better than the reference
    worse: bool = False
    seeds: dict | None = None  # what pairs: {seed: value}, or for a suite mean {dataset column: {seed: value}}
    selected: dict | None = None  # the `select` setting (learning rate, ...) the final cells of this column used
    samples: dict | None = None  # {seed: per-example correctness} where the records logged them (--log-samples)
    shared: bool = False  # a suite mean whose seeds are shared by its datasets (spec seed_scope: task)


@dataclass(kw_only=True)
class TaskTable:
    task: str
    protocol_versions: list[str]
    metric: str
    mode: str
    columns: list[str]  # dataset columns, then group means
    group_columns: list[str]
    rows: dict[str, dict[str, Cellv]] = field(default_factory=dict)  # backbone -> column -> value
    seeds: dict[str, str] = field(default_factory=dict)  # backbone -> "3" or "2-3"
    refs: dict[str, str] = field(default_factory=dict)  # backbone -> the backbone it is compared with
    notes: list[str] = field(default_factory=list)
    setting: str = ""  # the report-axis setting of a table split by axis ('shots=25'), else ''
    decimals: int = 1  # digits after the point in the markdown cells
    footnote: str | None = None  # what the cells are, when not the default (means over seeds)
    row_label: str = "backbone"  # what a row is (the DTN diagnostics table: a norm of one backbone)
    pixels: dict = field(default_factory=dict)  # backbone -> the input normalisation of its cells
    changed: set = field(default_factory=set)  # (setting, value, source) its cells took from outside the defaults
    members: dict = field(default_factory=dict)  # group column -> the dataset columns it averages
    tally: list | None = None  # the columns a wins / ties / losses count reads (None: every non-group column)
    question: str = "stem"  # stem: vs the plain backbone; sanity: vs random init of the same architecture
    axes: dict = field(default_factory=dict)  # the report-axis values of a table split by axis ({'shots': 25})
    code: dict = field(default_factory=dict)  # what code computed its records (code_summary)

    @property
    def reference(self) -> str | None:
        """The one reference every compared row shares, if there is one."""
        names = set(self.refs.values())
        return names.pop() if len(names) == 1 else None

    @property
    def references(self) -> list[str]:
        return sorted(set(self.refs.values()))


def seed_counts(ns) -> str:
    """A row's seeds column: '3', or '2-3' when its cells have different numbers of seeds, '0' without any."""
    ns = set(ns)
    return (str(min(ns)) if len(ns) == 1 else f"{min(ns)}-{max(ns)}") if ns else "0"


def _judge(delta: Estimate | None, mode: str) -> tuple[bool, bool]:
    if delta is None or not delta.excludes_zero:
        return False, False
    better = (delta.mean > 0) == (mode == "max")
    return better, not better


def plain_of(arch: str) -> str:
    """The architecture without its stem and DTN, following the names' grammar `{size}{patch}[_{stem}][_dtn][_rep]`
    (`b16_dpn_dtn_rep` -> `b16_rep`): what a modification changes. Plugin names lose everything after their
    first underscore alike. Text only: reports never import torch."""
    rep = arch.endswith("_rep")
    return arch.split("_")[0] + ("_rep" if rep and "_" in arch else "")


def stem_references(backbones, reference: str | None = None) -> dict[str, str]:
    """The stem question's pairs: backbone -> its reference. With `reference` every other backbone is compared with
    it; else each with the plain backbone of the same weights source (`mu4_dpn@embedded` -> `mu4@embedded`,
    random-init `mu4_dtn` -> `mu4`), where the records hold one. A backbone with weights of its own
    (`b16_dpn@a.npz`) has no such partner: name one with --reference."""
    names = set(backbones)
    if reference is not None:
        return {b: reference for b in sorted(names) if b != reference}
    out = {}
    for b in sorted(names):
        arch, weights, _ = parse(b)
        partner = plain_of(arch) + (f"@{weights}" if weights else "")
        if partner != b and partner in names and weights in ("", "embedded"):
            out[b] = partner
    return out


def sanity_references(backbones) -> dict[str, str]:
    """The sanity question's pairs: each checkpoint -> random init of its own architecture, where the records hold
    one (`mu4_dpn@embedded` -> `mu4_dpn`)."""
    names = set(backbones)
    return {b: model_name(b) for b in sorted(names) if parse(b).at and model_name(b) in names}


def check_reference(reference: str | None, backbones, where: str) -> None:
    if reference is not None and reference not in backbones:
        backbones = sorted(backbones)
        raise UserError(
            f"--reference {reference!r} has no results for {where}{close_matches(reference, backbones)}; "
            f"backbones: {', '.join(backbones)}"
        )


def pair(t: TaskTable, refs: dict[str, str], question: str = "stem") -> TaskTable:
    """Fill each row's paired differences from its reference `refs[row]` (a row of the same table), judge them,
    and order the rows: each reference, then the rows compared with it, then the rest."""
    t.refs = {b: r for b, r in refs.items() if b in t.rows and r in t.rows and r != b}
    t.question = question
    for b, r in t.refs.items():
        for col, v in t.rows[b].items():
            rv = t.rows[r].get(col)
            v.delta = _paired(v, rv) if rv is not None else None
            v.better, v.worse = _judge(v.delta, t.mode)
    order = []
    for r in t.references:
        order += [r] + [b for b in t.rows if t.refs.get(b) == r and b not in t.refs.values()]
    order += [b for b in t.rows if b not in order]
    t.rows = {b: t.rows[b] for b in dict.fromkeys(order)}
    return t


def _paired(v: Cellv, ref: Cellv) -> Estimate | None:
    """The paired difference of two cells: over seeds, or for suite means the suite mean of per-dataset paired
    differences (records.stats.suite_mean: over per-seed means where the seeds are shared, Welch's t over dataset
    means where not); per example (a paired bootstrap over examples) where the seeds give no interval and both
    sides logged their samples."""
    if not v.seeds or not ref.seeds:
        return None
    suite = isinstance(next(iter(v.seeds.values())), dict)
    d = paired_suite_difference(v.seeds, ref.seeds, shared=v.shared) if suite else paired_difference(v.seeds, ref.seeds)
    if (d is None or d.ci is None) and v.samples and ref.samples:
        shared = sorted(set(v.samples) & set(ref.samples))
        if len(shared) == 1 and len(v.samples[shared[0]]) == len(ref.samples[shared[0]]):
            return paired_bootstrap(v.samples[shared[0]], ref.samples[shared[0]])
    return d


def sanity_table(t: TaskTable) -> TaskTable | None:
    """The sanity question on the rows of `t`: each checkpoint against random init of its own architecture; None
    where no checkpoint has its random init beside it."""
    refs = sanity_references(t.rows)
    if not refs:
        return None
    s = copy.deepcopy(t)
    s.rows = {b: s.rows[b] for b in dict.fromkeys([x for b, r in refs.items() for x in (r, b)])}
    return pair(s, refs, question="sanity")


def axis_settings(entries: list[Entry]) -> list[dict]:
    """The report-axis settings of a task's entries (few-shot {'shots': 25}, ...), headline first: the
    largest value (most shots, the full train fraction), then down."""
    settings = {canon(e.axes): e.axes for e in entries}

    def key(axes):  # numbers down from the largest, then anything else by its text
        return [(kind, -number, text) for kind, number, text in (value_order(axes[k]) for k in sorted(axes))]

    return sorted(settings.values(), key=key)


def build_tables(entries: list[Entry], reference: str | None = None, split_axes: bool = True) -> list[TaskTable]:
    """One table per task and protocol version (the newest first: cells of two protocols never share a table);
    with `split_axes` a task with report axes (few-shot shots) gets one table per axis setting, headline first,
    each with its group means. Without, one wide table with a column per dataset and setting (csv/json, the
    leaderboard's details). Rows are paired by `stem_references(backbones, reference)`."""
    by_task = defaultdict(list)
    for e in entries:
        by_task[e.task].append(e)
    for task, ents in by_task.items():
        check_reference(reference, {e.backbone for e in ents}, f"task {task!r}")
    by_protocol = defaultdict(list)
    for e in entries:
        by_protocol[(e.task, e.protocol_version)].append(e)
    tables = []
    for (task, _), ents in sorted(
        by_protocol.items(), key=lambda kv: (list(by_task).index(kv[0][0]), _newest_first(kv[0][1]))
    ):
        refs = stem_references({e.backbone for e in ents}, reference)
        if split_axes and any(e.axes for e in ents):
            for setting in axis_settings(ents):
                same = [e for e in ents if e.axes == setting]
                title = ", ".join(
                    f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in sorted(setting.items())
                )
                tables.append(pair(_table(task, same, setting=title, axes=setting), refs))
        else:
            tables.append(pair(_table(task, ents), refs))
    return tables


def _newest_first(version: str) -> tuple:
    try:
        return (0, -float(version), "")
    except ValueError:
        return (1, 0.0, version)


def _row(t: TaskTable, b: str, columns: list, cell_of: dict) -> tuple[dict, set]:
    """Backbone `b`'s row of dataset columns (its entries' estimates, seeds, selections and samples; each note into
    `t.notes`) and the seed counts its estimates rest on."""
    row, ns = {}, set()
    for col in columns:
        e = cell_of.get((b, col))
        if e is None:
            continue
        row[col] = Cellv(
            e.estimate,
            seeds=dict(e.per_seed),
            selected=dict(e.selected),
            samples=dict(e.samples) if e.samples else None,
        )
        if e.estimate:
            ns.add(e.estimate.n)
        if e.note:
            t.notes.append(f"{b} / {col}: {e.note}")
    return row, ns


def _table(task: str, ents: list[Entry], setting: str = "", axes: dict | None = None) -> TaskTable:
    """The values of `ents`: a column per dataset (per dataset and axis setting when settings are mixed), then
    group means; rows are backbones (paired afterwards by `pair`)."""
    backbones = sorted({e.backbone for e in ents})
    wide = not setting and any(e.axes for e in ents)
    column = (lambda e: e.column) if wide else (lambda e: e.dataset)
    # dataset order of the spec, then report-axis values by value (shots 1, 5, 10, 25; not as text)
    order = sorted(
        {
            (e.order, tuple((k, value_order(v)) for k, v in sorted(e.axes.items())), column(e), e.dataset, e.group)
            for e in ents
        }
    )
    order = [(o, c, d, g) for o, _, c, d, g in order]
    columns = [c for _, c, _, _ in order]
    # suite means need >= 2 datasets; columns of different axis settings (few-shot shots) are not averaged
    members = defaultdict(list)
    for _, col, _, g in order:
        members[g].append(col)
    singles = {g: cols for g, cols in members.items() if g and len(cols) == 1}
    groups = [] if wide else [g for g in members if g and len(members[g]) > 1]
    if len(groups) == 1 and len(members[groups[0]]) == len(columns):
        groups = []  # one group holding everything: its mean is the overall mean
    group_columns = groups + ([ALL] if len(columns) > 1 and not wide else [])
    first = ents[0]
    t = TaskTable(
        task=task,
        protocol_versions=sorted({e.protocol_version for e in ents}),
        metric=first.metric,
        mode=first.mode,
        columns=columns + group_columns,
        group_columns=group_columns,
        setting=setting,
        axes=dict(axes or {}),
    )
    t.members = {g: [c for _, c, _, grp in order if g == ALL or grp == g] for g in group_columns}
    t.members.update({g: cols for g, cols in singles.items() if not wide})  # a one-dataset group: that column
    cell_of = {(e.backbone, column(e)): e for e in ents}
    for e in ents:
        if e.pixels:
            t.pixels.setdefault(e.backbone, set()).add(e.pixels)
        t.changed.update(e.changed)
    for b in backbones:
        row, ns = _row(t, b, columns, cell_of)
        for g in group_columns:
            members_g = t.members[g]
            if not all(col in row and row[col].estimate for col in members_g):
                continue  # a backbone missing a dataset has no comparable suite mean
            per = {c: cell_of[(b, c)].per_seed for c in members_g}
            shared = seeds_shared(task)
            row[g] = Cellv(suite_mean(per, shared=shared), seeds={c: dict(v) for c, v in per.items()}, shared=shared)
        t.rows[b] = row
        t.seeds[b] = seed_counts(ns)
    return t
