"""The regression gate's second job (records.gate): test the statistical tier's matched cells and judge every
test. Each test has the direction and floor records.metrics declares for its metric.

- per comparison (task, dataset, backbone, stage, axes, split, metric): a moderated t over the seeds both sides
  have (records.stats.moderated_difference), its variance borrowing from every comparison of the task, split and
  metric; with one seed and no prior, McNemar's exact test where both sides logged their per-example results
  (--log-samples), else untestable;
- per (task, backbone, metric): `shift`, the sign test of whether its comparisons all moved one way;
- the broad tests over a task and backbone's runs (records.broad): pooled, moved, noise and spread.

The cell tests are one family and the broad tests another, each Holm-corrected at alpha / 2, so that a night's
family-wise error is at most alpha. A test fires when it is significant after Holm *and* its change passes a
magnitude floor (the metric's: `floor` points for a percentage, 0.5% of the baseline for a training loss, ...; half
of it for a pooled mean, a fifth for a shift, a factor 2 for a spread). Worse is a regression, better an
improvement. A metric declared `either` (a training signal, a diagnostic) that moves either way is a regression.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache

import numpy as np

from .match import NonFinite, direction, precision
from .metrics import EITHER, SIGNAL_FLOOR, SIGNALS, declared
from .record import value
from .stats import holm, mcnemar, moderated_difference, sign_test, variance_prior

ALPHA = 0.01  # family-wise error of one night's tests (Holm)
FLOOR = 0.5  # the smallest change of one comparison that counts, in metric units (accuracy, mIoU, recall: points)
POOLED_FLOOR = 0.5  # ... of a pooled mean, as a fraction of FLOOR
LOSS_FLOOR = SIGNAL_FLOOR  # ... of a training signal (a loss, a norm, an entropy), as a fraction of the baseline's
SPREAD_FLOOR = 2.0  # the smallest ratio (either way) of seed-to-seed standard deviations that counts
SHIFT_FLOOR = 0.2  # a consistent shift (every comparison one way): its mean change counts from this share of the floor
SHIFT_MIN = 6  # ... over at least this many comparisons of a task, backbone and metric
SIGNAL_NOISE = 10.0  # a training signal's noise test: the smallest rms change that counts, in arithmetic's rms
# the noise test's allowance for a runner whose arithmetic is noisier than the model's variants (another CPU, other
# kernels): a night up to NOISE_TOLERANCE times the model's rms is its null, so such a runner alarms at most alpha
NOISE_TOLERANCE = 2.0
NOISE_MODEL = "noise_model.json"  # beside this module: arithmetic noise per task and metric (docs/regression.md)
PERCENT = ("accuracy", "error", "top5")  # metrics in points of one example each: 100 / examples


class Kind(StrEnum):
    """What a comparison tests: one cell's seeds, or a whole task and backbone."""

    CELL = "cell"
    POOLED = "pooled"  # the mean change over every data set and seed
    MOVED = "moved"  # groups that moved differently from one another, more than their seeds vary
    NOISE = "noise"  # runs that scatter more than arithmetic scatters them
    SPREAD = "spread"  # the seed-to-seed spread
    SHIFT = "shift"  # comparisons that all moved one way


BROAD = (Kind.POOLED, Kind.MOVED, Kind.NOISE, Kind.SPREAD, Kind.SHIFT)


class Verdict(StrEnum):
    """A comparison's verdict."""

    UNCHANGED = "unchanged"
    UNTESTED = "untested"  # no test applies (one seed, no prior, no logged examples)
    REGRESSED = "regressed"
    IMPROVED = "improved"
    SPREAD = "spread"  # the seed spread changed, either way
    MOVED = "moved"
    NOISE = "noise"
    SHIFT = "shift"
    SEE_POOLED = "see pooled"  # moved, noise or shift where the pooled mean regressed: told once, there


FAILING = (Verdict.REGRESSED, Verdict.SPREAD, Verdict.MOVED, Verdict.NOISE, Verdict.SHIFT)


@dataclass(kw_only=True)
class Comparison:
    kind: Kind
    task: str
    backbone: str
    dataset: str = ""  # '' for a broad test
    stage: str = ""
    axes: dict = field(default_factory=dict)
    split: str = ""
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
    verdict: Verdict = Verdict.UNCHANGED
    precision_changed: bool = False  # a cell: some seed's records ran a step in another precision

    @property
    def big(self) -> bool:
        if self.kind in (Kind.MOVED, Kind.NOISE):
            return self.change >= self.floor
        if self.kind == Kind.SPREAD:
            return self.change >= self.floor or self.change <= 1 / self.floor
        return abs(self.change) >= self.floor


def is_signal(metric: str) -> bool:
    """A pretraining probe's training signal (records.metrics.SIGNALS: split "train", a move either way fails)."""
    return metric.startswith(SIGNALS)


@cache
def noise_model() -> dict:
    """{task: {metric: {kind: {"ms": mean square of a unit's change, "units": how many units estimated it}}}}: the
    arithmetic noise model that `python -m benchmarks.gate_power --noise-model` measures on benign runs (kind:
    `kernels` where both sides ran a unit in the same precision, `precision` where a step's precision differs)."""
    import json
    from importlib.resources import files

    return json.loads((files("transferbench.records") / NOISE_MODEL).read_text())["tasks"]


def floor_of(task: str, metric: str, baseline: float, floor: float, record: dict | None = None) -> float:
    """The magnitude floor of one comparison: `floor` in points for a percentage, else the metric's declared floor
    (records.metrics: a cosine's in its own units, a training signal's or a norm's relative to the baseline)."""
    return declared(task, metric, record).floor_at(baseline, floor)


def either(task: str, metric: str) -> bool:
    """Whether a move of `metric` either way is a change (a diagnostic, a training signal): no better, no worse."""
    return declared(task, metric).direction == EITHER


def quantum(r: dict, split: str, metric: str) -> float:
    """One example of `split` in the metric's units (accuracy or error in points: 100 / examples), where the record
    says how many examples it scored; else 0."""
    if metric not in PERCENT:
        return 0.0
    info = r.get("info") or {}
    n = info.get(f"{split}_examples") or (info.get("eval_examples") if split == "test" else None)
    return 100.0 / n if isinstance(n, (int, float)) and n > 0 else 0.0


def cell_comparisons(pairs: dict, axes_of: dict, floor: float, nonfinite: list | None = None) -> tuple[list, dict]:
    """One test per matched group over its seeds: a moderated t (records.stats.moderated_difference), whose variance
    borrows from every comparison of the same task, split and metric, all backbones (`variance_prior`: a night's
    few-cell tasks, ADE20K's or high-res', have too few comparisons per backbone to estimate it); with one seed and
    no prior, McNemar's test on the examples where both sides logged them. Returns the comparisons and, per group,
    seed -> (baseline value, current value) where both sides have a finite one; a value that is not finite is
    appended to `nonfinite` and fails the night."""
    paired, rows = {}, []
    for group, seeds in sorted(pairs.items()):
        vals = {s: tuple(value(r, group.split, group.metric) for r in pair) for s, pair in seeds.items()}
        vals = {s: v for s, v in vals.items() if None not in v}
        bad = [s for s, v in vals.items() if not all(math.isfinite(x) for x in v)]
        if nonfinite is not None:
            nonfinite += [NonFinite(group, s) for s in bad]
        vals = paired[group] = {s: v for s, v in vals.items() if s not in bad}
        if not vals:
            continue
        first = next(iter(seeds.values()))[0]
        sign = direction(first, group.metric)
        rows.append((group, seeds, vals, first, [sign * (v[1] - v[0]) for v in vals.values()]))
    priors = _priors(rows)
    comparisons = []
    for group, seeds, vals, first, diffs in rows:
        level = float(np.mean([v[0] for v in vals.values()]))
        d = moderated_difference(
            diffs,
            priors.get((group.task, group.split, group.metric), (math.nan, 0.0)),
            min_sd=quantum(first, group.split, group.metric),
        )
        comparisons.append(
            Comparison(
                kind=Kind.CELL,
                task=group.task,
                backbone=group.backbone,
                dataset=group.dataset,
                stage=group.stage,
                axes=axes_of[group],
                split=group.split,
                metric=group.metric,
                baseline=level,
                current=float(np.mean([v[1] for v in vals.values()])),
                change=d.mean,
                n=d.n,
                p=d.p if d.p is not None else _examples_p(*seeds[next(iter(vals))], group.split),
                floor=floor_of(group.task, group.metric, level, floor, first),
                low=d.low,
                high=d.high,
                precision_changed=any(precision(rb) != precision(rc) for rb, rc in seeds.values()),
            )
        )
    return comparisons, paired


def _priors(rows: list) -> dict:
    """(task, split, metric) -> the variance prior (records.stats.variance_prior) of its comparisons' seeds."""
    spreads = defaultdict(lambda: ([], []))  # (task, split, metric) -> (variances, degrees of freedom)
    for group, _, _, _, diffs in rows:
        if len(diffs) > 1:
            at = (group.task, group.split, group.metric)
            spreads[at][0].append(float(np.var(diffs, ddof=1)))
            spreads[at][1].append(len(diffs) - 1)
    return {at: variance_prior(*v) for at, v in spreads.items()}


def shift_comparisons(cells: list, floor: float) -> list:
    """Per (task, backbone, metric): did its comparisons all move one way? The exact sign test over the
    comparisons that changed, with no regard to their size (a change of 0.24 points in each of 84 cells passes
    every t-test, yet 84 of 84 worse is no chance), at a floor of SHIFT_FLOOR of the usual one on their mean
    change. Comparisons whose precision differs between the sides are left out: bf16 against fp32 moves numbers
    one way on its own."""
    groups = defaultdict(list)
    for x in cells:
        if x.split != "val" and x.change != 0 and not x.precision_changed:
            groups[(x.task, x.backbone, x.metric)].append(x)
    out = []
    for (task, backbone, metric), xs in sorted(groups.items()):
        if len(xs) < SHIFT_MIN:
            continue
        worse = sum(x.change < 0 for x in xs)
        mean = float(np.mean([x.change for x in xs]))
        level = float(np.mean([x.baseline for x in xs]))
        out.append(
            broad(
                Kind.SHIFT,
                task,
                backbone,
                metric,
                baseline=level,
                current=level + mean,
                change=mean,
                n=len(xs),
                p=sign_test(worse, len(xs)),
                floor=SHIFT_FLOOR * floor_of(task, metric, level, floor),
            )
        )
    return out


def broad(kind: Kind, task: str, backbone: str, metric: str, **values) -> Comparison:
    """A comparison over a whole (task, backbone, metric): pooled, spread, moved, noise or shift."""
    return Comparison(kind=kind, task=task, backbone=backbone, metric=metric, **values)


def judge(comparisons: list, alpha: float) -> None:
    """Each comparison's verdict. Two families, each Holm-corrected at alpha / 2 (Bonferroni between them: the
    night's family-wise error stays at most alpha): the few broad tests (pooled, moved, noise, spread, shift) are not
    diluted by the hundreds of cell tests. A metric declared `either` (a diagnostic, a training signal) that moves
    either way has regressed. A set that got worse fails even where another set gained (no "uneven" escape)."""
    rejected = {}
    for family in ((Kind.CELL,), BROAD):
        members = [x for x in comparisons if x.kind in family]
        rejected.update(zip(map(id, members), holm([x.p for x in members], alpha / 2)))
    for x in comparisons:
        sig = rejected[id(x)]
        x.significant = sig
        if x.p is None:
            x.verdict = Verdict.UNTESTED
        elif sig and x.big:
            worse = x.change < 0 or either(x.task, x.metric)
            if x.kind in (Kind.SPREAD, Kind.MOVED, Kind.NOISE):
                x.verdict = Verdict(x.kind.value)
            elif x.kind == Kind.SHIFT:
                x.verdict = Verdict.SHIFT if worse else Verdict.IMPROVED
            else:
                x.verdict = Verdict.REGRESSED if worse else Verdict.IMPROVED
    pooled = {(y.task, y.backbone, y.metric): y.verdict for y in comparisons if y.kind == Kind.POOLED}
    for x in comparisons:
        moved = x.verdict in (Verdict.MOVED, Verdict.NOISE)
        if (moved or x.verdict == Verdict.SHIFT) and pooled.get((x.task, x.backbone, x.metric)) == Verdict.REGRESSED:
            x.verdict = Verdict.SEE_POOLED  # told once, by the pooled mean
        elif moved and not either(x.task, x.metric) and x.low is not None:
            if x.low > -x.floor:  # no run got worse by the floor: runs that gained, unevenly or beyond arithmetic
                x.verdict = Verdict.IMPROVED


def _examples_p(rb: dict, rc: dict, split: str) -> float | None:
    """McNemar's p of one seed's cell, where both records logged their per-example results."""
    from .store import read_samples

    a, b = read_samples(rc, split), read_samples(rb, split)
    if a is None or b is None or np.shape(a) != np.shape(b) or np.asarray(a).dtype != bool:
        return None
    return mcnemar(a, b).p
