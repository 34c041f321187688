"""The regression gate's second job (gate.decide): test the statistical tier's matched cells and judge every
test. Each test has the direction and floor gate.metrics declares for its metric.

- per comparison (task, dataset, backbone, stage, axes, split, metric): across arithmetic (the same code, weights,
  data and protocol), a t of the mean change over the seeds against the arithmetic noise model's variance
  (gate.noise, measured on benign arithmetic, never on tonight); against seed variance where the change is the
  question (an accepted protocol or code change, other weights or data): the plain paired t over the seeds, or
  McNemar's exact test for one seed with logged examples; untested where neither applies;
- in gate.broad: per (task, metric), over every backbone, `shift`, the sign test of whether its comparisons moved
  one way more often than the model allows (a Poisson binomial where a step's precision differs); the broad tests
  over a task and backbone's runs: pooled, noise and spread against the model; pooled, spread and moved against
  seed variance.

The cell tests are one family and the broad tests another, each Holm-corrected at alpha / 2 (a test that cannot
reach its level left out: `family`), so that a night's family-wise error is at most alpha. A test fires when it is
significant after Holm *and* its change passes a magnitude floor (the metric's: `floor` points for a percentage,
0.5% of the baseline for a training loss, ...; half of it for a pooled mean, a fifth for a shift). Worse is a
regression, better an improvement. A metric declared `either` (a training signal, a diagnostic) that moves either
way is a regression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from ..records.record import value
from ..records.stats import MAX_DF, holm, mcnemar, paired_difference, t_estimate
from .keys import NonFinite, direction
from .metrics import EITHER, PER_EXAMPLE, SIGNAL_FLOOR, SIGNALS, declared

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
    ACCEPTED = "accepted"  # a diagnostic or training signal that moved where its code changed as accepted


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
    sign: float = 1.0  # +1 where higher is better (or either), -1 where lower is: `change` is signed by it
    null: str = "arithmetic"  # what the test's null is: arithmetic (the noise model) | seeds (seed variance)
    diffs: dict = field(default_factory=dict)  # a cell: seed -> signed change (> 0 better)
    variance: float | None = None  # a cell against the model: one seed's change's variance (tolerance included)
    model_df: int = 0  # ... and the degrees of freedom it was measured on
    bias: float = 0.0  # ... the model's mean change for its kind (bf16 against fp32 moves numbers one way)
    worse_share: float = 0.5  # ... the share of the model's moved changes that got worse
    reach: float = 0.0  # the smallest p the test can reach (a discrete test's; 0 for a continuous one)
    kinds: frozenset = frozenset()  # a cell: the kinds of difference between its two sides' arithmetic
    resolution: float = 0.0  # a cell: the smallest step its metric takes
    accepted: bool = False  # its cells' code changed as the ledger or --accept-code accepts (a meant change)

    @property
    def big(self) -> bool:
        if self.kind in (Kind.MOVED, Kind.NOISE):
            return self.change >= self.floor
        if self.kind == Kind.SPREAD and self.null == "seeds":  # a ratio of seed spreads, either way
            return self.change >= self.floor or self.change <= 1 / self.floor
        if self.kind == Kind.SPREAD:  # the runs' deviations beyond arithmetic: their size
            return self.change >= self.floor
        return abs(self.change) >= self.floor


def is_signal(metric: str) -> bool:
    """A pretraining probe's training signal (gate.metrics.SIGNALS: split "train", a move either way fails)."""
    return metric.startswith(SIGNALS)


def floor_of(task: str, metric: str, baseline: float, floor: float, record: dict | None = None) -> float:
    """The magnitude floor of one comparison: `floor` in points for a percentage, else the metric's declared floor
    (gate.metrics: a cosine's in its own units, a training signal's or a norm's relative to the baseline)."""
    return declared(task, metric, record).floor_at(baseline, floor)


def either(task: str, metric: str) -> bool:
    """Whether a move of `metric` either way is a change (a diagnostic, a training signal): no better, no worse."""
    return declared(task, metric).direction == EITHER


def quantum(r: dict, split: str, metric: str) -> float:
    """One example of `split` in the metric's units (accuracy or error in points: 100 / examples), where the record
    says how many examples it scored; else 0."""
    if metric not in PER_EXAMPLE:
        return 0.0
    info = r.get("info") or {}
    n = info.get(f"{split}_examples") or (info.get("eval_examples") if split == "test" else None)
    return 100.0 / n if isinstance(n, (int, float)) and n > 0 else 0.0


def raw(r: dict, split: str, metric: str) -> float | None:
    """A finished record's value of `metric` on `split`: None where the record lacks it, NaN where it holds it as
    `null` (a number that could not be computed fails the night as a non-finite value, never drops out)."""
    if r["status"] != "ok":
        return None
    found = (r.get("metrics") or {}).get(split, {})
    if metric in found and found[metric] is None:
        return math.nan
    return value(r, split, metric)


def cell_comparisons(
    pairs: dict,
    axes_of: dict,
    floor: float,
    *,
    model=None,
    seed_null=frozenset(),
    code_accepted=frozenset(),
) -> tuple[list, dict, list]:
    """One test per matched group over its seeds. Against the arithmetic noise model (gate.noise) where the two
    sides ran the same code on the same weights, data and protocol: the mean change over the seeds, with the
    model's variance of one (cell, seed)'s change for the task, split, metric and the kinds of difference between
    the two sides' arithmetic (`gate.noise.kinds_of`: another CPU, ATen's kernels, threads, oneDNN, bf16 against
    fp32; the largest of theirs) times NOISE_TOLERANCE squared, floored at the metric's resolution, as a t on
    the model's degrees of freedom (one seed is testable: the variance is known). Against seed variance where the
    weights or data differ or the group's cells are of an accepted protocol change (`seed_null`: CellKey): the plain
    paired t over the seeds (the spread floored at one example); one seed there, McNemar's test on the examples
    where both sides logged them. A group the model does not cover is untested (p None), and fails the night unless
    allowed. Returns the comparisons; per group, seed -> (baseline value, current value) where both sides have a
    finite one; and each seed whose value is not finite (or `null`) on either side (NonFinite: it fails the night)."""
    from .noise import judged

    paired, comparisons, nonfinite = {}, [], []
    for group, seeds in sorted(pairs.items()):
        if not judged(group.task, group.dataset, group.metric):
            continue
        vals, bad = _seed_values(group, seeds)
        nonfinite += [NonFinite(group, s) for s in bad]
        paired[group] = vals
        if not vals:
            continue
        c = _cell(group, seeds, vals, axes_of[group], floor, by_seeds := _seed_null(group, seeds, seed_null))
        c.accepted = any(_in(group, s, code_accepted) for s in seeds)
        first = next(iter(seeds.values()))[0]
        if by_seeds:
            _against_seeds(c, vals, seeds, first, group)
        elif model is not None:
            _against_model(c, model.entry(group.task, group.split, group.metric, c.kinds), first, group, c.baseline)
        comparisons.append(c)
    return comparisons, paired, nonfinite


def _cell(group, seeds: dict, vals: dict, axes: dict, floor: float, by_seeds: bool) -> Comparison:
    """A group's comparison before its test: the means over its seeds (`vals`), each seed's signed change, the
    metric's floor, the kinds of difference between the two sides' arithmetic and its null."""
    from .noise import PRECISION, kinds_of

    first = next(iter(seeds.values()))[0]
    sign = direction(first, group.metric)
    diffs = {s: sign * (v[1] - v[0]) for s, v in vals.items()}
    level = float(np.mean([v[0] for v in vals.values()]))
    kind = frozenset().union(*(kinds_of(*seeds[s]) for s in vals))  # what differs, over the seeds
    return Comparison(
        kind=Kind.CELL,
        task=group.task,
        backbone=group.backbone,
        dataset=group.dataset,
        stage=group.stage,
        axes=axes,
        split=group.split,
        metric=group.metric,
        baseline=level,
        current=float(np.mean([v[1] for v in vals.values()])),
        change=float(np.mean(list(diffs.values()))),
        n=len(diffs),
        p=None,
        floor=floor_of(group.task, group.metric, level, floor, first),
        precision_changed=PRECISION in kind,
        sign=sign,
        null="seeds" if by_seeds else "arithmetic",
        diffs=diffs,
        kinds=kind,
    )


def _seed_values(group, seeds: dict) -> tuple[dict, list]:
    """(seed -> (baseline value, current value) where both are finite, the seeds where one is not) of a group's
    matched records (a missing value leaves its seed out)."""
    vals = {s: tuple(raw(r, group.split, group.metric) for r in pair) for s, pair in seeds.items()}
    vals = {s: v for s, v in vals.items() if None not in v}
    bad = [s for s, v in vals.items() if not all(math.isfinite(x) for x in v)]
    return {s: v for s, v in vals.items() if s not in bad}, bad


def _against_seeds(c: Comparison, vals: dict, seeds: dict, first: dict, group) -> None:
    """A cell's test where the change is the question: the paired t over its seeds (the spread floored at one
    example); one seed, McNemar's test on the logged examples."""
    d = paired_difference(
        {s: c.sign * v[1] for s, v in vals.items()},
        {s: c.sign * v[0] for s, v in vals.items()},
        min_sd=quantum(first, group.split, group.metric),
    )
    c.p = d.p if d.p is not None else _examples_p(*seeds[next(iter(vals))], group.split)
    c.low, c.high = d.low, d.high


def _against_model(c: Comparison, entry, first: dict, group, level: float) -> None:
    """A cell's test across arithmetic: its mean change beyond the shift the model expects (bf16 against fp32 moves
    numbers one way), against NOISE_TOLERANCE^2 times the model's variance floored at the metric's resolution, a t
    on the model's degrees of freedom; the interval of the change excludes the expected shift exactly where p <
    0.05. No entry: untested (p None)."""
    if entry is None:
        return
    from .noise import resolution

    res = c.resolution = resolution(first, group.split, group.metric, level)
    c.variance = NOISE_TOLERANCE**2 * max(entry.ms, res**2)
    c.model_df = max(int(entry.df), 1)
    c.bias = entry.mean if c.precision_changed else 0.0
    c.worse_share = entry.shrunk_worse if c.precision_changed else 0.5
    est = t_estimate(c.change - c.bias, math.sqrt(c.variance / c.n), min(c.model_df, MAX_DF), c.n)
    c.p, c.low, c.high = est.p, est.low + c.bias, est.high + c.bias


def _in(group, seed: int, keys) -> bool:
    from .keys import CellKey

    return CellKey(group.task, group.dataset, group.backbone, group.stage, seed, group.axes) in keys


def _seed_null(group, seeds: dict, seed_null) -> bool:
    """Whether a group is judged against seed variance: its cells are of an accepted protocol change, or a seed's
    two records read other weights or data (a comparison of two checkpoints: there the change is the question)."""
    from .keys import CellKey

    if any(CellKey(group.task, group.dataset, group.backbone, group.stage, s, group.axes) in seed_null for s in seeds):
        return True
    return any(rb.get(w) != rc.get(w) for rb, rc in seeds.values() for w in ("checkpoint_sha256", "data_version"))


def broad(kind: Kind, task: str, backbone: str, metric: str, **values) -> Comparison:
    """A comparison over a whole (task, backbone, metric): pooled, spread, moved, noise or shift."""
    return Comparison(kind=kind, task=task, backbone=backbone, metric=metric, **values)


def family(members: list, alpha: float) -> list:
    """The members of a Holm family at level `alpha` that can fire (Tarone 1990): a discrete test (a sign test
    over few comparisons) whose smallest reachable p (`reach`) is above the level it would be held to only dilutes
    the others. K is the smallest count for which at most K tests can reach alpha / K; those tests are the family."""
    for k in range(1, len(members) + 1):
        able = [x for x in members if x.reach <= alpha / k]
        if len(able) <= k:
            return able
    return members


def judge(comparisons: list, alpha: float) -> None:
    """Each comparison's verdict. Two families, each Holm-corrected at alpha / 2 (Bonferroni between them: the
    night's family-wise error stays at most alpha): the few broad tests (pooled, noise, spread, shift, moved) are
    not diluted by the hundreds of cell tests; a test that cannot reach its level is left out of its family
    (`family`). A metric declared `either` (a diagnostic, a training signal) that moves either way has regressed. A
    set that got worse fails even where another set gained (no "uneven" escape)."""
    rejected = {}
    for kinds in ((Kind.CELL,), BROAD):
        members = [x for x in comparisons if x.kind in kinds and x.p is not None]
        able = family(members, alpha / 2)
        rejected.update(zip(map(id, able), holm([x.p for x in able], alpha / 2)))
    for x in comparisons:
        sig = rejected.get(id(x), False)
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
    for x in comparisons:  # a meant change of a diagnostic or a training signal: shown, accepted
        if x.accepted and x.verdict in FAILING and either(x.task, x.metric):
            x.verdict = Verdict.ACCEPTED
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
    from ..records.store import read_samples

    a, b = read_samples(rc, split), read_samples(rb, split)
    if a is None or b is None or np.shape(a) != np.shape(b) or np.asarray(a).dtype != bool:
        return None
    return mcnemar(a, b).p
