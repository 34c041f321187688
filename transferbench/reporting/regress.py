"""The regression gate between two records folders (last night's and tonight's): docs/regression.md.

1. Matching. Cells match on what they are: task, dataset, backbone, stage, seed and the report axes (the
   hyper-parameters that vary between a dataset's cells on either side: shots, lr in the select stage, ...). A
   final stage's selected values (its `select` keys) are an outcome, not an identity.
2. Protocol changes. Every other setting of a matched cell (hyper-parameters, the dataset's configuration, the
   protocol version) must agree. A difference is listed by setting (`pool: gap → tok`) and fails the gate unless
   it is accepted by name (`--accept TASK:SETTING`); a changed cell's numbers are shown but not tested.
3. Tests:
   - per comparison (task, dataset, backbone, stage, axes, split): the paired t-test over the seeds both sides
     have (records.stats.paired_difference); with one seed, McNemar's exact test where both sides logged their
     per-example results (--log-samples), else untestable;
   - per (task, backbone): the pooled test of the mean change over all its datasets, seeds and settings
     (records.stats.suite_mean on the per-(dataset, seed) mean changes, the leaderboard's suite test), which sees
     a broad shift that no single cell shows;
   - per (task, backbone, metric): `moved_test`, the F-test that every comparison's true change is 0, which sees
     cells that move both ways while the mean stays (it fails the night where the pooled mean did not fire);
   - per (task, backbone): the F-test of the seed-to-seed spread (collapsed or exploded).
   The cell tests are one family and the pooled, moved and spread tests another, each Holm-corrected at alpha / 2, so
   that a night's family-wise error is at most alpha. A test fires when it is significant after Holm *and* its
   change passes a magnitude floor (`floor` in metric units for a comparison, 0.5% of the baseline for a training
   loss, half of either for a pooled mean, a factor 2 for a spread). Worse is a regression, better an
   improvement; both are reported, only regressions (and spread changes) fail. A training loss that moves either
   way is a regression: a training curve is not a score, and a moved one is changed pretraining code.
4. The exact tier comes first. A matched cell whose two records carry the same arithmetic digest
   (transferbench.arithmetic: kernels, threads, BLAS, library versions, precision, ...) is judged to the bit, not
   by statistics: equal outputs pass; different outputs where the code fingerprints differ fail, naming the
   modules that changed (`--accept-code MODULE` accepts an intended change); different outputs from the same code,
   weights and data are *irreproducible* and fail. Only the cells whose arithmetic differs (or is unrecorded) reach
   the tests of 3.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as _scipy
from tabulate import tabulate

from ..arithmetic import differences as arithmetic_differences
from ..fingerprint import changed_modules
from ..hashing import canon
from ..records.stats import holm, mcnemar, paired_difference, pooled_variance, suite_mean, variance_ratio

ALPHA = 0.01  # family-wise error of one night's tests (Holm)
FLOOR = 0.5  # the smallest change of one comparison that counts, in metric units (accuracy, mIoU, recall: points)
POOLED_FLOOR = 0.5  # ... of a pooled mean, as a fraction of FLOOR
LOSS_FLOOR = 0.005  # ... of a training loss (`loss@STEP`), as a fraction of the baseline's
SPREAD_FLOOR = 2.0  # the smallest ratio (either way) of seed-to-seed standard deviations that counts


def words(axes: dict) -> str:
    """Axes in words: `shots=25, lr=0.01`."""
    return ", ".join(f"{k}={_value(v)}" for k, v in axes.items())


def _value(v) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(v)
    return canon({"v": v})[5:-1] if not isinstance(v, (int, float)) else repr(v)


@dataclass
class Comparison:
    kind: str  # cell | pooled | spread
    task: str
    backbone: str
    dataset: str  # '' for pooled and spread tests
    stage: str
    axes: dict
    split: str
    metric: str
    baseline: float  # mean (cell, pooled) or seed standard deviation (spread)
    current: float
    change: float  # current - baseline, signed so that > 0 is better (spread: the sd ratio)
    n: int  # seeds (cell), datasets (pooled), degrees of freedom (spread)
    p: float | None
    floor: float
    low: float | None = None  # the 95% interval of the change, where the test has one
    high: float | None = None
    significant: bool = False
    verdict: str = "unchanged"  # regressed | improved | unchanged | untested | spread

    @property
    def setting(self) -> str:
        return " ".join(x for x in (self.stage, words(self.axes)) if x)

    @property
    def big(self) -> bool:
        if self.kind == "moved":
            return self.change >= self.floor
        if self.kind == "spread":
            return self.change >= self.floor or self.change <= 1 / self.floor
        return abs(self.change) >= self.floor


@dataclass
class ProtocolChange:
    task: str
    setting: str
    before: str
    after: str
    cells: int = 0
    backbones: set = field(default_factory=set)
    change: list = field(default_factory=list)  # per changed cell: current - baseline (> 0 better)
    accepted: bool = False


@dataclass
class ExactCell:
    """One matched cell of the exact tier whose outputs differ."""

    task: str
    dataset: str
    backbone: str
    stage: str
    seed: int
    axes: dict
    causes: tuple  # the modules whose code changed between the two fingerprints; () if none
    change: float | None  # current - baseline of the main metric (> 0 better), None where unavailable
    accepted: bool = False

    @property
    def cell(self) -> str:
        axes = f" {words(self.axes)}" if self.axes else ""
        return f"{self.task} / {self.dataset} / {self.backbone} {self.stage}{axes} seed {self.seed}".replace("  ", " ")


@dataclass
class Exact:
    """The exact tier: matched cells whose records carry one arithmetic digest."""

    identical: int = 0
    changed: list = field(default_factory=list)  # ExactCell: outputs differ and code, weights or data changed
    irreproducible: list = field(default_factory=list)  # ExactCell: outputs differ, nothing else did
    statistical: int = 0  # matched cells left to the statistical tier (their arithmetic differs or is unrecorded)
    why: dict = field(default_factory=dict)  # what differs in the arithmetic -> cells it sent to the statistical tier
    enabled: bool = True

    @property
    def judged(self) -> int:
        return self.identical + len(self.changed) + len(self.irreproducible)

    @property
    def failing(self) -> list:
        return [x for x in self.changed if not x.accepted]

    @property
    def accepted(self) -> list:
        return [x for x in self.changed if x.accepted]

    def modules(self) -> dict:
        """cause (a module) -> the changed cells it is named in."""
        out: dict = defaultdict(int)
        for x in self.changed:
            for m in x.causes:
                out[m] += 1
        return dict(sorted(out.items()))


@dataclass
class Gate:
    comparisons: list[Comparison]
    protocol: list[ProtocolChange]
    missing: list  # baseline cells (task, dataset, backbone, stage, seed, axes) without a current counterpart
    new: list
    exact: Exact  # the cells of equal arithmetic, judged to the bit
    selection: list  # (task, dataset, backbone, axes, seed, before, after): a final stage selected differently
    alpha: float
    floor: float = FLOOR
    diverged: list = field(default_factory=list)  # current records that diverged where the baseline's cell was ok

    @property
    def tests(self) -> int:
        return sum(x.p is not None for x in self.comparisons)

    def of(self, kind: str, verdict: str | None = None) -> list[Comparison]:
        return [c for c in self.comparisons if c.kind == kind and (verdict is None or c.verdict == verdict)]

    @property
    def regressed(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict in ("regressed", "spread", "moved")]

    @property
    def improved(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict == "improved"]

    @property
    def unaccepted(self) -> list[ProtocolChange]:
        return [p for p in self.protocol if not p.accepted]

    def direction(self) -> str:
        """'' or a sentence when the cell changes point one way more than chance allows (a sign test at alpha
        over the comparisons that changed)."""
        cells = [c for c in self.of("cell") if c.change != 0]
        worse = sum(c.change < 0 for c in cells)
        if len(cells) < 10:
            return ""
        p = _scipy.binomtest(worse, len(cells), 0.5).pvalue
        if p >= self.alpha:
            return ""
        way = "worse" if worse * 2 > len(cells) else "better"
        k = worse if way == "worse" else len(cells) - worse
        return (
            f"Changes point one way: {k} of the {len(cells)} comparisons that moved got {way} (sign test p = {p:.1g})."
        )


def _latest(records: list[dict]) -> list[dict]:
    return sorted(records, key=lambda r: r.get("finished_at", ""))


def _axes(*sides: list[dict]) -> dict:
    """(task, stage) -> the hyper-parameters that vary between the cells of one (dataset, backbone) on a side."""
    values = defaultdict(lambda: defaultdict(set))
    for side, records in enumerate(sides):
        for r in records:
            group = values[(r["task"], r["dataset"], r["backbone"], r.get("stage", ""), side)]
            for k, v in r["hparams"].items():
                group[k].add(canon({"v": v}))
    out = defaultdict(set)
    for (task, _, _, stage, _), keys in values.items():
        out[(task, stage)] |= {k for k, vs in keys.items() if len(vs) > 1}
    return out


def _identity(r: dict, axes: dict) -> tuple:
    stage = r.get("stage", "")
    chosen = set(r.get("select", [])) if stage == "final" else set()
    ax = {k: r["hparams"][k] for k in sorted(axes[(r["task"], stage)] - chosen) if k in r["hparams"]}
    return (r["task"], r["dataset"], r["backbone"], stage, int(r["seed"]), canon(ax)), ax


def _settings(r: dict, axes: dict) -> dict:
    """Everything of a cell that is neither its identity nor its outcome, as {name: canonical text}."""
    stage = r.get("stage", "")
    skip = axes[(r["task"], stage)] | (set(r.get("select", [])) if stage == "final" else set())
    out = {k: _value(v) for k, v in r["hparams"].items() if k not in skip}
    out.update({f"dataset.{k}": _value(v) for k, v in (r.get("dataset_config") or {}).items()})
    out["protocol_version"] = str(r.get("protocol_version"))
    return out


def _index(records: list[dict], axes: dict) -> dict:
    out = {}
    for r in _latest(records):
        key, ax = _identity(r, axes)
        out[key] = (r, ax)
    return out


def _value_of(r: dict, split: str, metric: str | None = None) -> float | None:
    if r["status"] != "ok":
        return None
    v = (r.get("metrics") or {}).get(split, {}).get(metric or r["metric"])
    return None if v is None else float(v)


def _metrics(rb: dict, rc: dict, split: str) -> list[str]:
    """What a split is judged on: the record's metric, and the training curve's fixed points (`loss@STEP`, lower is
    better) where the records keep them."""
    have = set((rb.get("metrics") or {}).get(split, {})) | set((rc.get("metrics") or {}).get(split, {}))
    return sorted(m for m in have if m == rb["metric"] or m.startswith("loss@"))


def floor_of(metric: str, baseline: float, floor: float) -> float:
    """The magnitude floor of one comparison: `floor` in the metric's units, or for a training loss LOSS_FLOOR of the
    baseline's value (a loss has no common unit across tasks and steps)."""
    return LOSS_FLOOR * abs(baseline) if metric.startswith("loss@") else floor


def _direction(r: dict, metric: str) -> float:
    """+1 where higher is better, -1 where lower is."""
    if metric != r["metric"]:
        return -1.0  # loss@STEP
    return 1.0 if r.get("mode", "max") == "max" else -1.0


def accepts_code(accept_code, cause: str) -> bool:
    """Whether `accept_code` (module names, with or without the leading `transferbench.`, a package naming every
    module under it) names this cause of a changed cell."""
    name = cause.split(" ")[0]
    for a in accept_code or ():
        for full in {a, f"transferbench.{a}"}:
            if name == full or name.startswith(full + "."):
                return True
    return False


def accepts(accept, task: str, setting: str) -> bool:
    """Whether `accept` (TASK, TASK:SETTING or :SETTING entries) names this change."""
    return any(a in (task, f"{task}:{setting}", f":{setting}", f"*:{setting}") for a in accept or ())


def gate(
    baseline: list[dict],
    current: list[dict],
    *,
    floor: float = FLOOR,
    alpha: float = ALPHA,
    accept=(),
    accept_code=(),
    exact: bool = True,
    shared=None,
) -> Gate:
    """Match, judge the cells of equal arithmetic exactly (`exact`; False: every cell goes to the statistical tier,
    as against a fixed anchor), test and judge the rest (module docstring). `shared(task)`: whether one run per
    seed serves every dataset of a task (spec.seeds_shared), which decides the pooled test's units."""
    if shared is None:
        from ..spec import seeds_shared as shared
    axes = _axes(baseline, current)
    b, c = _index(baseline, axes), _index(current, axes)
    tier = Exact(enabled=exact)
    changes, selection, pairs, axes_of = _match(b, c, axes, tier, accept_code)
    for pc in changes.values():
        pc.accepted = accepts(accept, pc.task, pc.setting)
    comparisons, paired = _cell_comparisons(pairs, axes_of, floor)
    comparisons += _suite_comparisons(pairs, paired, floor, shared)
    comparisons += _moved_comparisons(paired, floor)
    _judge(comparisons, alpha)
    return Gate(
        comparisons,
        sorted(changes.values(), key=lambda p: (p.task, p.setting)),
        sorted(k for k in b if k not in c),
        sorted(k for k in c if k not in b),
        tier,
        selection,
        alpha,
        floor,
        [c[k][0] for k in sorted(set(b) & set(c)) if b[k][0]["status"] == "ok" and c[k][0]["status"] == "diverged"],
    )


def _match(b: dict, c: dict, axes, tier: Exact, accept_code=()) -> tuple[dict, list, dict, dict]:
    """The records both sides hold, matched: protocol changes (a setting that differs), changed selections of a
    final stage, the cells of equal arithmetic judged exactly (into `tier`), and for the statistical tier the pairs
    of every other (task, dataset, backbone, stage, axes, split, metric) per seed."""
    changes: dict[tuple, ProtocolChange] = {}
    selection = []
    pairs = defaultdict(dict)  # (task, dataset, backbone, stage, axes, split, metric) -> seed -> (base, cur) records
    axes_of = {}
    for key in sorted(set(b) & set(c)):
        (rb, ax), (rc, _) = b[key], c[key]
        sb, sc = _settings(rb, axes), _settings(rc, axes)
        differs = sorted(k for k in set(sb) | set(sc) if sb.get(k) != sc.get(k))
        task, dataset, backbone, stage, seed, axkey = key
        if differs:
            for k in differs:
                pc = changes.setdefault(
                    (task, k, sb.get(k, "(none)"), sc.get(k, "(none)")),
                    ProtocolChange(task, k, sb.get(k, "(none)"), sc.get(k, "(none)")),
                )
                pc.cells += 1
                pc.backbones.add(backbone)
                vb, vc = _value_of(rb, _main_split(rb)), _value_of(rc, _main_split(rb))
                if vb is not None and vc is not None:
                    pc.change.append(_direction(rb, rb["metric"]) * (vc - vb))
            continue
        if stage == "final":
            chosen = {k: rb["hparams"].get(k) for k in rb.get("select", [])}
            now = {k: rc["hparams"].get(k) for k in rb.get("select", [])}
            if chosen != now:
                selection.append((task, dataset, backbone, words(ax), seed, words(chosen), words(now)))
        if _judged_exactly(rb, rc, key, ax, tier, accept_code):
            continue
        for split in sorted(set(rb.get("metrics") or {}) | set(rc.get("metrics") or {})):
            for metric in _metrics(rb, rc, split):
                group = (task, dataset, backbone, stage, axkey, split, metric)
                pairs[group][seed] = (rb, rc)
                axes_of[group] = ax
    return changes, selection, pairs, axes_of


def _cell_comparisons(pairs: dict, axes_of: dict, floor: float) -> tuple[list, dict]:
    """One paired test per matched group over its seeds (McNemar on the examples with one seed); returns the
    comparisons and, per group, seed -> (baseline value, current value) where both sides have one."""
    comparisons, paired = [], {}
    for group, seeds in sorted(pairs.items()):
        task, dataset, backbone, stage, _, split, metric = group
        vals = {s: (_value_of(rb, split, metric), _value_of(rc, split, metric)) for s, (rb, rc) in seeds.items()}
        vals = paired[group] = {s: v for s, v in vals.items() if None not in v}
        if not vals:
            continue
        sign = _direction(next(iter(seeds.values()))[0], metric)
        level = float(np.mean([v[0] for v in vals.values()]))
        d = paired_difference({s: sign * v[1] for s, v in vals.items()}, {s: sign * v[0] for s, v in vals.items()})
        low, high, p = (d.low, d.high, d.p) if d.n > 1 else (None, None, _examples_p(*seeds[next(iter(vals))], split))
        comparisons.append(
            Comparison(
                "cell",
                task,
                backbone,
                dataset,
                stage,
                axes_of[group],
                split,
                metric,
                level,
                float(np.mean([v[1] for v in vals.values()])),
                d.mean,
                d.n,
                p,
                floor_of(metric, level, floor),
                low,
                high,
            )
        )
    return comparisons, paired


def _broad(kind, task, backbone, metric, baseline, current, change, n, p, floor, low=None, high=None) -> Comparison:
    """A comparison over a whole (task, backbone, metric): pooled, spread or moved."""
    return Comparison(kind, task, backbone, "", "", {}, "", metric, baseline, current, change, n, p, floor, low, high)


def _suite_comparisons(pairs: dict, paired: dict, floor: float, shared) -> list:
    """Per (task, backbone, metric), over the reported results: the pooled test of the suite mean and the test of
    the seed spread. Units are per (dataset, seed) means over the dataset's comparisons (per seed suite means
    where one run per seed serves every dataset)."""
    units = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    signs = {}
    for group, vals in paired.items():
        task, dataset, backbone, stage, _, split, metric = group
        if split == "val" or not vals:  # the reported results only: a select stage's val sweep is left to the cells
            continue
        sign = signs[(task, backbone, metric)] = _direction(next(iter(pairs[group].values()))[0], metric)
        for s, (vb, vc) in vals.items():
            units[(task, backbone, metric)][dataset][s].append((sign * vb, sign * vc))
    out = []
    for (task, backbone, metric), per_dataset in sorted(units.items()):
        base, cur = (
            {
                ds: {s: float(np.mean([v[i] for v in vs])) for s, vs in seeds.items()}
                for ds, seeds in per_dataset.items()
            }
            for i in (0, 1)
        )
        est = suite_mean({ds: {s: cur[ds][s] - base[ds][s] for s in base[ds]} for ds in base}, shared=shared(task))
        sign = signs[(task, backbone, metric)]
        level_b = sign * float(np.mean([np.mean(list(v.values())) for v in base.values()]))
        level_c = sign * float(np.mean([np.mean(list(v.values())) for v in cur.values()]))
        pooled_floor = POOLED_FLOOR * floor_of(metric, level_b, floor)
        out.append(
            _broad(
                "pooled",
                task,
                backbone,
                metric,
                level_b,
                level_c,
                est.mean,
                len(base),
                est.p,
                pooled_floor,
                est.low,
                est.high,
            )
        )
        if shared(task):  # one run per seed: the spread is that of the per-seed suite means
            seeds = sorted(set.intersection(*(set(v) for v in base.values())))
            gb = [[np.mean([base[ds][s] for ds in base]) for s in seeds]]
            gc = [[np.mean([cur[ds][s] for ds in cur]) for s in seeds]]
        else:
            gb, gc = [list(v.values()) for v in base.values()], [list(v.values()) for v in cur.values()]
        ratio, p = variance_ratio(gc, gb)
        if not math.isnan(ratio):
            dof = sum(len(g) - 1 for g in gc)
            out.append(
                _broad("spread", task, backbone, metric, _pooled_sd(gb), _pooled_sd(gc), ratio, dof, p, SPREAD_FLOOR)
            )
    return out


def _moved_comparisons(paired: dict, floor: float) -> list:
    """Per (task, backbone, metric): did its comparisons move more than their seeds vary, either way?"""
    moved, levels = defaultdict(list), defaultdict(list)  # the paired differences; the baseline's values
    for group, vals in paired.items():
        task, dataset, backbone, stage, _, split, metric = group
        if len(vals) > 1:
            moved[(task, backbone, metric)].append([vc - vb for vb, vc in vals.values()])
            levels[(task, backbone, metric)] += [vb for vb, _ in vals.values()]
    out = []
    for (task, backbone, metric), diffs in sorted(moved.items()):
        rms, p, df1, df2 = moved_test(diffs)
        level = floor_of(metric, float(np.mean(levels[(task, backbone, metric)])), floor)
        out.append(_broad("moved", task, backbone, metric, 0.0, rms, rms, df1, p, level))
    return out


def _judge(comparisons: list, alpha: float) -> None:
    """Each comparison's verdict. Two families, each Holm-corrected at alpha / 2 (Bonferroni between them: the
    night's family-wise error stays at most alpha): the few broad tests (pooled, moved, spread) are not diluted by
    the hundreds of cell tests."""
    rejected = {}
    for family in (("cell",), ("pooled", "moved", "spread")):
        members = [x for x in comparisons if x.kind in family]
        rejected.update(zip(map(id, members), holm([x.p for x in members], alpha / 2)))
    for x in comparisons:
        sig = rejected[id(x)]
        x.significant = sig
        if x.p is None:
            x.verdict = "untested"
        elif sig and x.big:
            # a training curve is not a score: lower is not better, a moved curve is changed pretraining code
            worse = x.change < 0 or x.metric.startswith("loss@")
            x.verdict = x.kind if x.kind in ("spread", "moved") else "regressed" if worse else "improved"
    called = {(y.task, y.backbone, y.metric) for y in comparisons if y.kind == "pooled" and y.verdict != "unchanged"}
    for x in comparisons:  # a move that the pooled mean already calls is told once, by the pooled mean
        if x.verdict == "moved" and (x.task, x.backbone, x.metric) in called:
            x.verdict = "see pooled"


def _judged_exactly(rb: dict, rc: dict, key: tuple, ax: dict, tier: Exact, accept_code) -> bool:
    """Judge one matched cell in the exact tier where both records are finished, read the same weights and data
    and carry one arithmetic digest; False (the statistical tier's) otherwise, counting why. New weights are what a
    comparison of two checkpoints is for: those cells are judged statistically."""
    if rb["status"] != "ok" or rc["status"] != "ok":
        return False
    ab, ac = rb.get("arithmetic") or {}, rc.get("arithmetic") or {}
    inputs = [f"{what} differs" for what in ("checkpoint_sha256", "data_version") if rb.get(what) != rc.get(what)]
    if not tier.enabled or inputs or not ab.get("digest") or ab.get("digest") != ac.get("digest"):
        if tier.enabled:
            why = inputs or arithmetic_differences(ab, ac) or ["arithmetic differs"]
            reason = why[0] + (f" (and {len(why) - 1} more)" if len(why) > 1 else "")
            tier.why[reason] = tier.why.get(reason, 0) + 1
        tier.statistical += 1
        return False
    if _outputs(rb) == _outputs(rc):
        tier.identical += 1
        return True
    task, dataset, backbone, stage, seed, _ = key
    fb = rb.get("fingerprint")
    changed = changed_modules(fb, rc.get("fingerprint") or {}) if fb else [("code unrecorded", "changed")]
    causes = [m if how == "changed" else f"{m} ({how})" for m, how in changed]
    split = _main_split(rb)
    vb, vc = _value_of(rb, split), _value_of(rc, split)
    change = None if vb is None or vc is None else _direction(rb, rb["metric"]) * (vc - vb)
    cell = ExactCell(task, dataset, backbone, stage, seed, ax, tuple(causes), change)
    if causes:
        cell.accepted = all(accepts_code(accept_code, m) for m in causes)
        tier.changed.append(cell)
    else:
        tier.irreproducible.append(cell)
    return True


def _outputs(r: dict) -> str:
    """What the exact tier compares: the outputs digest and the metrics."""
    return canon({"outputs": r.get("outputs"), "metrics": r.get("metrics")})


def moved_test(diffs: list) -> tuple[float, float, int, int]:
    """(rms, p, df1, df2) of "every comparison's true change is 0", two-sided: comparisons c with paired seed
    differences d_cs, F = (sum_c n_c mean_c^2 / C) / (sum_c sum_s (d_cs - mean_c)^2 / sum_c (n_c - 1)) on (C,
    sum_c (n_c - 1)) degrees of freedom (the one-way ANOVA's F of the cell means against 0, with the seed-to-seed
    spread of the differences pooled over comparisons); rms = sqrt(mean_c mean_c^2), the size of the move. Where
    the differences do not vary within any comparison, p is 0 if anything moved, else 1."""
    arrays = [np.asarray(d, dtype=np.float64) for d in diffs if len(d) > 1]
    num = sum(a.size * a.mean() ** 2 for a in arrays)
    ss = sum(((a - a.mean()) ** 2).sum() for a in arrays)
    df1, df2 = len(arrays), sum(a.size - 1 for a in arrays)
    rms = float(math.sqrt(np.mean([a.mean() ** 2 for a in arrays]))) if arrays else 0.0
    if not arrays or ss == 0:
        return rms, (0.0 if num > 0 else 1.0), df1, df2
    return rms, float(_scipy.f.sf((num / df1) / (ss / df2), df1, df2)), df1, df2


def _pooled_sd(groups) -> float:
    return float(math.sqrt(pooled_variance(groups)[0]))


def _main_split(r: dict) -> str:
    metrics = r.get("metrics") or {}
    return "test" if "test" in metrics else next(iter(metrics), "test")


def _examples_p(rb: dict, rc: dict, split: str) -> float | None:
    """McNemar's p of one seed's cell, where both records logged their per-example results."""
    from ..records.store import read_samples

    a, b = read_samples(rc, split), read_samples(rb, split)
    if a is None or b is None or np.shape(a) != np.shape(b) or np.asarray(a).dtype != bool:
        return None
    return mcnemar(a, b).p


def verdict(
    baseline: list[dict],
    current: list[dict],
    floor: float = FLOOR,
    *,
    alpha: float = ALPHA,
    accept=(),
    accept_code=(),
    exact: bool = True,
    fail_on_missing: bool = False,
    fail_on_failed: bool = False,
    title: str = "Regression report",
) -> tuple[str, int]:
    """(markdown report, exit code): 1 when a cell of equal arithmetic changed by code not accepted
    (`accept_code`) or irreproducibly, a test fires for the worse, the seed spread changed, a protocol change is
    not accepted, a cell of `current` failed (with `fail_on_failed`) or baseline cells are missing from `current`
    (with `fail_on_missing`); else 0. `exact` False: the statistical tier judges every cell (a fixed anchor)."""
    g = gate(baseline, current, floor=floor, alpha=alpha, accept=accept, accept_code=accept_code, exact=exact)
    failed = [r for r in current if r["status"] == "failed"] + g.diverged
    reasons = []
    if g.exact.failing:
        reasons.append(f"{len(g.exact.failing)} changed by code")
    if g.exact.irreproducible:
        reasons.append(f"{len(g.exact.irreproducible)} irreproducible")
    if g.regressed:
        reasons.append(f"{len(g.regressed)} regressed")
    if g.unaccepted:
        reasons.append(f"{len(g.unaccepted)} protocol changes")
    if fail_on_failed and failed:
        reasons.append(f"{len(failed)} cells failed or diverged")
    if fail_on_missing and g.missing:
        reasons.append(f"{len(g.missing)} cells missing")
    return report(g, failed=failed, title=title, reasons=reasons), int(bool(reasons))


def _md(rows, head) -> str:
    return tabulate(rows, head, tablefmt="github", disable_numparse=True)


def _num(x: float | None, fmt: str = "+.2f") -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _p(p: float | None) -> str:
    return "untested" if p is None else f"{p:.2g}"


def report(g: Gate, *, failed=(), title: str = "Regression report", reasons=()) -> str:
    sections = (_exact_section, _protocol_section, _pooled_section, _moved_section, _spread_section, _cell_sections)
    lines = _summary(g, failed, title, reasons)
    for section in sections:
        lines += section(g)
    if g.selection:
        lines += [f"Selection changed in {len(g.selection)} final cells (e.g. {_selection(g.selection[0])}).", ""]
    return "\n".join(lines + _failed_section(failed) + _missing_sections(g))


def _summary(g: Gate, failed, title: str, reasons) -> list[str]:
    """The verdict line, the counts and how a test fires."""
    lines: list[str] = []
    cells = g.of("cell")
    counts = {v: sum(c.verdict == v for c in cells) for v in ("regressed", "improved", "unchanged", "untested")}
    pooled_bad = g.of("pooled", "regressed")
    spread = g.of("spread", "spread")
    head = f"**{'REGRESSION' if reasons else 'OK'}**" + (f" ({', '.join(reasons)})" if reasons else "")
    lines += [
        f"# {title}",
        "",
        f"{head}: {_tiers(g)}",
        "",
        f"Statistical tier: {counts['regressed']} regressed, {counts['improved']} improved, "
        f"{counts['unchanged']} unchanged, "
        f"{counts['untested']} untested of {len(cells)} compared; pooled over each task and backbone "
        f"{len(pooled_bad)} regressed, {len(g.of('pooled', 'improved'))} improved of {len(g.of('pooled'))}, "
        f"{len(g.of('moved', 'moved'))} moved either way; {len(spread)} seed spreads changed; "
        f"{len(g.unaccepted)} protocol changes"
        + (f" ({len(g.protocol) - len(g.unaccepted)} accepted)" if len(g.protocol) > len(g.unaccepted) else "")
        + f"; {len(g.missing)} cells missing from current, {len(g.new)} new"
        + (f"; {len(failed)} cells of current failed or diverged" if failed else "")
        + "."
        + (f" {g.direction()}" if g.direction() else ""),
        "",
        f"A test fires when it is significant after Holm at α/2 within its family (the cells', or the pooled and "
        f"spread tests'; {g.tests} tests in all: the night's family-wise error is at most α = {g.alpha}) and its "
        f"change passes the floor ({g.floor:g} per comparison, {g.floor * POOLED_FLOOR:g} pooled; "
        f"{LOSS_FLOOR * 100:g}% and {LOSS_FLOOR * POOLED_FLOOR * 100:g}% of a training loss; a factor "
        f"{SPREAD_FLOOR:g} in seed spread); docs/regression.md.",
        "",
    ]
    return lines


def _protocol_section(g: Gate) -> list[str]:
    """Settings of matched cells that differ."""
    lines: list[str] = []
    if g.protocol:
        lines += [
            "## Protocol changes",
            "",
            "A setting of matched cells differs: their numbers are not compared. Accept a change on purpose with "
            "`--accept TASK:SETTING`.",
            "",
            _md(
                [
                    [
                        p.task,
                        f"{p.setting}: {p.before} → {p.after}",
                        p.cells,
                        ", ".join(sorted(p.backbones)),
                        _num(float(np.mean(p.change))) if p.change else "",
                        "accepted" if p.accepted else "FAILS",
                    ]
                    for p in g.protocol
                ],
                ["task", "change", "cells", "backbones", "mean change", "verdict"],
            ),
            "",
        ]
    return lines


def _pooled_section(g: Gate) -> list[str]:
    """The pooled test of each task and backbone."""
    lines: list[str] = []
    pooled = g.of("pooled")
    if pooled:
        lines += [
            "## Pooled over each task and backbone",
            "",
            _md(
                [
                    [
                        x.task,
                        x.backbone,
                        x.metric,
                        x.n,
                        f"{x.baseline:.2f}",
                        f"{x.current:.2f}",
                        _num(x.change),
                        f"[{_num(x.low)}, {_num(x.high)}]" if x.low is not None else "",
                        _p(x.p),
                        x.verdict,
                    ]
                    for x in pooled
                ],
                ["task", "backbone", "metric", "datasets", "baseline", "current", "change", "95% CI", "p", "verdict"],
            ),
            "",
        ]
    return lines


def _moved_section(g: Gate) -> list[str]:
    """The moved-either-way tests that fired or came close."""
    lines: list[str] = []
    either = [x for x in g.of("moved") if x.verdict == "moved" or (x.p is not None and x.p < g.alpha)]
    if either:
        lines += [
            "## Moved either way",
            "",
            "Comparisons of one task and backbone that moved more than their seeds vary, whatever the direction "
            "(an F-test of the per-comparison mean changes against 0, docs/regression.md); `moved` fails the "
            "night where the pooled mean did not already call it.",
            "",
            _md(
                [[x.task, x.backbone, x.metric, x.n, f"{x.current:.3g}", _p(x.p), x.verdict] for x in either],
                ["task", "backbone", "metric", "comparisons", "rms change", "p", "verdict"],
            ),
            "",
        ]
    return lines


def _spread_section(g: Gate) -> list[str]:
    """The seed-spread tests that fired or came close."""
    lines: list[str] = []
    spreads = [x for x in g.of("spread") if x.verdict == "spread" or (x.p is not None and x.p < g.alpha)]
    if spreads:
        lines += [
            "## Seed spread",
            "",
            _md(
                [
                    [
                        x.task,
                        x.backbone,
                        f"{x.baseline:.2f}",
                        f"{x.current:.2f}",
                        _num(x.change, ".2f"),
                        x.n,
                        _p(x.p),
                        x.verdict,
                    ]
                    for x in spreads
                ],
                ["task", "backbone", "baseline sd", "current sd", "ratio", "df", "p", "verdict"],
            ),
            "",
        ]
    return lines


def _cell_sections(g: Gate) -> list[str]:
    """The cells that regressed and those that improved."""
    lines: list[str] = []
    head_cells = [
        "task",
        "dataset",
        "backbone",
        "split",
        "metric",
        "baseline",
        "current",
        "change",
        "95% CI",
        "p",
        "n",
        "setting",
    ]
    for heading, rows in (("Regressions", g.of("cell", "regressed")), ("Improvements", g.of("cell", "improved"))):
        if rows:
            lines += [
                f"## {heading}",
                "",
                _md(
                    [
                        [
                            x.task,
                            x.dataset,
                            x.backbone,
                            x.split,
                            x.metric,
                            f"{x.baseline:.2f}",
                            f"{x.current:.2f}",
                            _num(x.change),
                            f"[{_num(x.low)}, {_num(x.high)}]" if x.low is not None else "",
                            _p(x.p),
                            x.n,
                            x.setting,
                        ]
                        for x in rows
                    ],
                    head_cells,
                ),
                "",
            ]
    return lines


def _tiers(g: Gate) -> str:
    """The report's first line: how many cells each tier judged, and what the exact tier found."""
    t = g.exact
    if not t.enabled:
        return f"exact tier off (a fixed anchor); {t.statistical} cells judged by the statistical tier."
    found = [f"{t.identical} bit-identical"]
    found += [f"{len(t.failing)} changed by code"] if t.failing or not t.accepted else []
    found += [f"{len(t.accepted)} changed by accepted code"] if t.accepted else []
    found += [f"{len(t.irreproducible)} irreproducible"]
    everything = "all " if t.judged and not t.statistical else ""
    return (
        f"{everything}{t.judged} cells judged exactly ({', '.join(found)}), {t.statistical} by the statistical tier "
        "(their arithmetic differs or is unrecorded)."
    )


def _exact_section(g: Gate) -> list[str]:
    """The exact tier: the modules that changed numbers, the cells they changed, irreproducible cells, and why
    other cells went to the statistical tier."""
    t, lines = g.exact, []
    if t.changed:
        rows = []
        for cause, n in t.modules().items():
            cells = [x for x in t.changed if cause in x.causes]
            moved = [abs(x.change) for x in cells if x.change is not None]
            verdict = "accepted" if all(x.accepted for x in cells) else "FAILS"
            rows.append(
                [cause, n, ", ".join(sorted({x.task for x in cells})), _num(max(moved, default=0), ".3g"), verdict]
            )
        lines += [
            "## Changed by code",
            "",
            "Cells computed in the same arithmetic from the same weights and data on both sides whose outputs differ, "
            "and the modules that changed between their fingerprints. Accept an intended change for one night with "
            "`--accept-code MODULE`.",
            "",
            _md(rows, ["changed", "cells", "tasks", "max |Δ| of the metric", "verdict"]),
            "",
        ]
        lines += _cell_list(t.changed, lambda x: f" (Δ {_num(x.change, '+.4g')})" + (" accepted" if x.accepted else ""))
    if t.irreproducible:
        lines += [
            "## Irreproducible",
            "",
            "Same code, weights, data and arithmetic on both sides, yet other outputs: a source of nondeterminism "
            "in these cells (docs/regression.md#irreproducible).",
            "",
        ]
        lines += _cell_list(t.irreproducible, lambda x: f" (Δ {_num(x.change, '+.4g')})")
    if t.enabled and t.why:
        lines += [
            "## Judged statistically",
            "",
            "Cells whose arithmetic, weights or data differ between the two sides (the first difference each shows):",
            "",
            _md(sorted(([k, v] for k, v in t.why.items()), key=lambda r: -r[1]), ["arithmetic", "cells"]),
            "",
        ]
    return lines


def _cell_list(cells, tail) -> list[str]:
    lines = [f"- {x.cell}{tail(x)}" for x in cells[:50]]
    if len(cells) > 50:
        lines.append(f"- ... and {len(cells) - 50} more")
    return lines + [""]


def _failed_section(failed) -> list[str]:
    """The cells of current that failed, or diverged where the baseline did not."""
    lines: list[str] = []
    if failed:
        lines += [
            "## Failed in current (or diverged where the baseline's cell did not)",
            "",
            _md(
                [
                    [
                        *(r["task"], r["dataset"], r["backbone"], r.get("stage", ""), r["seed"]),
                        *(r["status"], r.get("reason", "")),
                    ]
                    for r in failed
                ],
                ["task", "dataset", "backbone", "stage", "seed", "status", "reason"],
            ),
            "",
        ]
    return lines


def _missing_sections(g: Gate) -> list[str]:
    """Cells only one side holds (the first 50 of each)."""
    lines: list[str] = []
    for heading, keys in (("Missing from current", g.missing), ("New in current", g.new)):
        if keys:
            lines += [f"## {heading}", ""] + [
                f"- {k[0]} / {k[1]} / {k[2]} {k[3]} seed {k[4]}" + (f" ({_axes_text(k[5])})" if k[5] != "{}" else "")
                for k in keys[:50]
            ]
            if len(keys) > 50:
                lines.append(f"- ... and {len(keys) - 50} more")
            lines.append("")
    return lines


def _axes_text(key: str) -> str:
    import json

    return words(json.loads(key))


def _selection(s) -> str:
    task, dataset, backbone, ax, seed, before, after = s
    return f"{task} / {dataset} / {backbone}{f' {ax}' if ax else ''} seed {seed}: {before} → {after}"
