"""The regression gate's broad tests (records.gate), each over one task, backbone and metric's runs:

- `pooled`: the mean change over all its datasets, seeds and settings (records.stats.suite_mean on the per-(dataset,
  seed) mean changes, the leaderboard's suite test), which sees a broad shift that no single cell shows;
- `spread`: the F-test of the seed-to-seed spread (collapsed or exploded);
- `moved`: the F-test that every group's true change is 0 (records.stats.moved_test), which sees cells that move
  both ways while the mean stays;
- `noise`: whether the runs scatter more than arithmetic scatters them (records.stats.noise_test against the noise
  model measured on benign runs).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .comparisons import (
    NOISE_TOLERANCE,
    POOLED_FLOOR,
    SIGNAL_NOISE,
    SPREAD_FLOOR,
    Kind,
    broad,
    cell_comparisons,
    floor_of,
    is_signal,
    quantum,
)
from .match import Exact, axes, direction, index, match, precision
from .stats import moved_test, noise_test, pooled_variance, suite_mean, variance_ratio


def suite_comparisons(pairs: dict, paired: dict, floor: float, shared) -> list:
    """Per (task, backbone, metric), over the reported results: the pooled test of the suite mean and the test of
    the seed spread. Units are per (dataset, seed) means over the dataset's comparisons (per seed suite means
    where one run per seed serves every dataset)."""
    units = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    signs, quanta = {}, defaultdict(float)
    for group, vals in paired.items():
        if group.split == "val" or not vals:  # the reported results only: a select stage's val sweep is the cells'
            continue
        at = (group.task, group.backbone, group.metric)
        first = next(iter(pairs[group].values()))[0]
        sign = signs[at] = direction(first, group.metric)
        quanta[at] = max(quanta[at], quantum(first, group.split, group.metric))
        for s, (vb, vc) in vals.items():
            units[at][group.dataset][s].append((sign * vb, sign * vc))
    out = []
    for (task, backbone, metric), per_dataset in sorted(units.items()):
        at = (task, backbone, metric)
        base, cur = (
            {
                ds: {s: float(np.mean([v[i] for v in vs])) for s, vs in seeds.items()}
                for ds, seeds in per_dataset.items()
            }
            for i in (0, 1)
        )
        est = suite_mean(
            {ds: {s: cur[ds][s] - base[ds][s] for s in base[ds]} for ds in base},
            shared=shared(task),
            min_sd=quanta[at],
        )
        level_b = signs[at] * float(np.mean([np.mean(list(v.values())) for v in base.values()]))
        level_c = signs[at] * float(np.mean([np.mean(list(v.values())) for v in cur.values()]))
        out.append(
            broad(
                Kind.POOLED,
                task,
                backbone,
                metric,
                baseline=level_b,
                current=level_c,
                change=est.mean,
                n=len(base),
                p=est.p,
                floor=POOLED_FLOOR * floor_of(task, metric, level_b, floor),
                low=est.low,
                high=est.high,
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
            out.append(
                broad(
                    Kind.SPREAD,
                    task,
                    backbone,
                    metric,
                    baseline=_pooled_sd(gb),
                    current=_pooled_sd(gc),
                    change=ratio,
                    n=sum(len(g) - 1 for g in gc),
                    p=p,
                    floor=SPREAD_FLOOR,
                )
            )
    return out


@dataclass
class _Runs:
    """The statistical tier's runs per (task, backbone, metric) `at`."""

    units: dict = field(default_factory=dict)  # at -> {unit: mean change}; (data set, seed), or (seed,) where shared
    kind: dict = field(default_factory=dict)  # (at, unit) -> "precision" where a step's precision differs
    inputs: set = field(default_factory=set)  # (at, unit) computed from other weights or data
    levels: dict = field(default_factory=lambda: defaultdict(list))  # at -> the baseline's values
    quantum: dict = field(default_factory=lambda: defaultdict(float))  # at -> its comparisons' largest quantum
    sign: dict = field(default_factory=dict)  # at -> +1 where higher is better, -1 where lower is
    # at -> {(data set, stage, axes, split): {seed: change}}: the moved test's groups, which exist for every task (a
    # corruption, a stage, a shot count or a fraction is a group of its own, also where one run serves every set)
    sets: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(dict)))


def _units(pairs: dict, paired: dict, shared) -> _Runs:
    diffs = defaultdict(lambda: defaultdict(list))  # (task, backbone, metric) -> unit -> paired differences
    runs = _Runs()
    for group, vals in paired.items():
        at = (group.task, group.backbone, group.metric)
        for s, (vb, vc) in vals.items():
            unit = (s,) if shared(group.task) else (group.dataset, s)
            diffs[at][unit].append(vc - vb)
            runs.sets[at][(group.dataset, group.stage, group.axes, group.split)][s] = vc - vb
            runs.levels[at].append(vb)
            rb, rc = pairs[group][s]
            runs.quantum[at] = max(runs.quantum[at], quantum(rb, group.split, group.metric))
            runs.sign[at] = direction(rb, group.metric)
            if precision(rb) != precision(rc):
                runs.kind[(at, unit)] = "precision"
            if any(rb.get(w) != rc.get(w) for w in ("checkpoint_sha256", "data_version")):
                runs.inputs.add((at, unit))
    runs.units = {at: {unit: float(np.mean(d)) for unit, d in per.items()} for at, per in diffs.items()}
    return runs


def noise_units(baseline: list[dict], current: list[dict], shared=None) -> dict:
    """{(task, metric, kind): [each run's mean change]} between two sides that differ only in arithmetic (the
    statistical tier's units, every cell judged statistically): what `benchmarks.gate_power --noise-model` builds
    the noise model from."""
    if shared is None:
        from ..spec import seeds_shared as shared
    ax = axes(baseline, current)
    found = match(index(baseline, ax), index(current, ax), ax, Exact(enabled=False))
    _, paired = cell_comparisons(found.pairs, found.axes_of, 0.0)
    runs = _units(found.pairs, paired, shared)
    out = defaultdict(list)
    for at, u in runs.units.items():
        for unit, v in u.items():
            out[(at[0], at[2], runs.kind.get((at, unit), "kernels"))].append(v)
    return dict(out)


def moved_comparisons(pairs: dict, paired: dict, floor: float, shared, noise: dict, untested: dict) -> list:
    """Per (task, backbone, metric), on units that are runs (a data set's seed; a seed where one run serves every
    data set): each unit's mean change over its comparisons (shot counts, splits, swept settings of that run), then
    - `moved`: did its groups, each (data set, stage, axes, split) over its seeds (a corruption, a stage, a shot
      count, a fraction: groups in every task, also where one run serves every set), move differently from each
      other, more than their seeds vary (`records.stats.moved_test`)?
    - `noise`: did the runs scatter more than arithmetic scatters them (`records.stats.noise_test` against the
      noise model of the task and metric, per kind of unit: `precision` where a step's precision differs between
      the sides, else `kernels`)? Units computed from other weights or data, or of a kind the model lacks, are left
      out of it and counted in `untested` ((task, metric) -> units).
    A shift of every run alike is the pooled test's. Each comparison's `low` (signed, > 0 better) is the worst
    group's mean change (moved) or the worst run's change (noise): where none got worse by the floor, the move is an
    improvement; else it fails, whatever other groups or runs gained."""
    runs = _units(pairs, paired, shared)
    out = []
    for at, u in sorted(runs.units.items()):
        task, backbone, metric = at
        level = floor_of(task, metric, float(np.mean(runs.levels[at])), floor)
        groups = [list(seeds.values()) for _, seeds in sorted(runs.sets[at].items())]
        rms, p, df1, _ = moved_test(groups, min_sd=runs.quantum[at])
        if df1:  # the moved test's worst is the worst group's mean change (a corruption, a stage)
            low = min(runs.sign[at] * float(np.mean(g)) for g in groups)
            out.append(broad(Kind.MOVED, *at, baseline=0.0, current=rms, change=rms, n=df1, p=p, floor=level, low=low))
        model = (noise.get(task) or {}).get(metric) or {}
        tested, variances, dfs = [], [], []
        for unit, v in sorted(u.items()):
            m = model.get(runs.kind.get((at, unit), "kernels"))
            if m is None or (at, unit) in runs.inputs:
                untested[(task, metric)] = untested.get((task, metric), 0) + 1
                continue
            tested.append(v)
            variances.append(m["ms"] * NOISE_TOLERANCE**2)
            dfs.append(m["units"])
        if len(tested) > 1:
            rms, p = noise_test(tested, variances, min(dfs))
            base = float(np.sqrt(np.mean(variances))) / NOISE_TOLERANCE  # the model's own rms
            # a training signal has no unit of its own: its noise test fires at SIGNAL_NOISE times arithmetic's rms
            at_least = SIGNAL_NOISE * base if is_signal(metric) else level
            worst = min(runs.sign[at] * v for v in u.values())  # the noise test's: the worst run
            out.append(
                broad(
                    Kind.NOISE,
                    *at,
                    baseline=base,
                    current=rms,
                    change=rms,
                    n=len(tested),
                    p=p,
                    floor=at_least,
                    low=worst,
                )
            )
    return out


def _pooled_sd(groups) -> float:
    return float(math.sqrt(pooled_variance(groups)[0]))
