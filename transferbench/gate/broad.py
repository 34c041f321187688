"""The regression gate's broad tests (gate.decide), each over one task, backbone and metric's runs, and the shift
(`shift_comparisons`): per task and metric over every backbone, whether more runs went one way than the noise model
allows.

Against the arithmetic noise model (`model_comparisons`: the cells whose two sides ran the same code on the same
weights, data and protocol in other arithmetic):
- `pooled`: the mean change over all its runs, against the variance the model allows them;
- `noise`: whether the runs moved beyond arithmetic (records.scatter.noise_test);
- `spread`: whether the runs of one data set deviate from their mean over seeds beyond arithmetic (a seed-to-seed
  spread multiplied or removed, seeds that disagree).

Against seed variance (`suite_comparisons`, `moved_comparisons`: the cells of an accepted protocol change, or of
other weights or data, where the change itself is the question):
- `pooled`: the suite-mean test of the leaderboard (records.stats.suite_mean) on the per-(dataset, seed) changes;
- `spread`: the F-test of the seed-to-seed spread (collapsed or exploded);
- `moved`: the F-test that every group's true change is alike (records.scatter.moved_test).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ..records.scatter import moved_test, noise_test, pooled_variance, variance_ratio
from ..records.stats import MAX_DF, suite_mean, t_estimate
from .comparisons import (
    NOISE_TOLERANCE,
    POOLED_FLOOR,
    SHIFT_FLOOR,
    SHIFT_MIN,
    SIGNAL_NOISE,
    SPREAD_FLOOR,
    Kind,
    broad,
    floor_of,
    is_signal,
    quantum,
)
from .keys import direction


def suite_comparisons(pairs: dict, paired: dict, floor: float, shared) -> list:
    """Per (task, backbone, metric), over the reported results: the pooled test of the suite mean and the test of
    the seed spread. Units are per (dataset, seed) means over the dataset's comparisons (per seed suite means
    where one run per seed serves every dataset)."""
    units, signs, quanta = _suite_units(pairs, paired)
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
                null="seeds",
            )
        )
        gb, gc = _spread_groups(base, cur, shared(task))
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
                    null="seeds",
                )
            )
    return out


def _suite_units(pairs: dict, paired: dict):
    """(units, signs, quanta) per (task, backbone, metric) of the reported results: {dataset: {seed: [(baseline,
    current) signed, > 0 better]}}, the metric's direction and its largest resolution."""
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
    return units, signs, quanta


def _spread_groups(base: dict, cur: dict, shared: bool) -> tuple[list, list]:
    """The groups whose spread the variance ratio compares: each data set's seeds, or, where one run per seed serves
    every data set, the per-seed suite means."""
    if not shared:
        return [list(v.values()) for v in base.values()], [list(v.values()) for v in cur.values()]
    seeds = sorted(set.intersection(*(set(v) for v in base.values())))
    gb = [[np.mean([base[ds][s] for ds in base]) for s in seeds]]
    gc = [[np.mean([cur[ds][s] for ds in cur]) for s in seeds]]
    return gb, gc


def moved_comparisons(pairs: dict, paired: dict, floor: float) -> list:
    """Per (task, backbone, metric) of the groups judged against seed variance: did its groups, each (data set,
    stage, axes, split) over its seeds (a corruption, a stage, a shot count or a fraction is a group of its own),
    move differently from each other, more than their seeds vary (`records.scatter.moved_test`)? Its `low` (signed,
    > 0 better) is the worst group's mean change: where none got worse by the floor, the move is an improvement."""
    sets = defaultdict(dict)  # at -> {(data set, stage, axes, split): {seed: signed change}}
    levels, quanta, first = defaultdict(list), defaultdict(float), {}
    for group, vals in sorted(paired.items()):
        at = (group.task, group.backbone, group.metric)
        r = first.setdefault(at, next(iter(pairs[group].values()))[0])
        sign = direction(r, group.metric)
        sets[at][(group.dataset, group.stage, group.axes, group.split)] = {
            s: sign * (vc - vb) for s, (vb, vc) in vals.items()
        }
        levels[at] += [vb for vb, _ in vals.values()]
        quanta[at] = max(quanta[at], quantum(r, group.split, group.metric))
    out = []
    for at, groups_of in sorted(sets.items()):
        task, backbone, metric = at
        groups = [list(seeds.values()) for _, seeds in sorted(groups_of.items()) if seeds]
        level = floor_of(task, metric, float(np.mean(levels[at])), floor)
        rms, p, df1, _ = moved_test(groups, min_sd=quanta[at])
        if df1:
            low = min(float(np.mean(g)) for g in groups)
            out.append(
                broad(
                    Kind.MOVED,
                    *at,
                    baseline=0.0,
                    current=rms,
                    change=rms,
                    n=df1,
                    p=p,
                    floor=level,
                    low=low,
                    null="seeds",
                )
            )
    return out


def model_comparisons(cells: list, floor: float, shared, model=None) -> list:
    """Per (task, backbone, metric), over its cells judged against the noise model and their reported splits (the
    select stage's val split left out), on units that are runs (a data set's seed; a seed where one run serves every
    data set): each run's mean change u over its comparisons (shot counts, stages, swept settings), beyond the shift
    the model expects, with the variance V the model allows it. Two bounds of V exist: the model's own variance of a
    run's mean (`Model.run_entry`, measured on the variants' runs, floored at the run's resolution), and the square
    of the mean of its comparisons' standard deviations (the largest variance their mean can have, whatever their
    correlation), each on its own degrees of freedom; the test takes the one whose critical change is smaller, which
    the model and the night's design decide, never tonight's values. Then
    - `pooled`: the mean of the runs' changes, a t with variance sum V / R^2: a broad shift no single cell shows;
    - `noise`: Q = sum u^2 / V against F(R, df) (`records.scatter.noise_test`): runs that moved beyond arithmetic, both
      ways or with seeds that disagree;
    - `spread`: the runs' deviations from their data set's 1/V-weighted mean over seeds, sum (u - mean)^2 / V against
      F(sum (n - 1), df): seeds that disagree, a seed-to-seed spread multiplied or removed. Its size is the root mean
      square deviation, against the metric's floor.
    Each test's `low` is its worst run's change (signed, > 0 better): where none got worse by the floor, a move is an
    improvement."""
    runs = defaultdict(lambda: defaultdict(list))  # at -> unit -> [cell comparison, seed]
    for x in cells:
        if x.kind != Kind.CELL or x.null != "arithmetic" or x.variance is None or x.split == "val":
            continue
        for s in x.diffs:
            runs[(x.task, x.backbone, x.metric)][(s,) if shared(x.task) else (x.dataset, s)].append((x, s))
    return [x for at, units in sorted(runs.items()) for x in _model_tests(at, units, floor, model)]


def _model_tests(at: tuple, units: dict, floor: float, model) -> list:
    """`model_comparisons`' three tests of one (task, backbone, metric) over its runs (`units`: run -> [cell
    comparison, seed])."""
    task, _, metric = at
    xs = [x for v in units.values() for x, _ in v]
    level = float(np.mean([x.baseline for x in xs]))
    at_floor = floor_of(task, metric, level, floor)
    raw = {k: float(np.mean([x.diffs[s] for x, s in v])) for k, v in units.items()}
    u = {k: raw[k] - float(np.mean([x.bias for x, _ in v])) for k, v in units.items()}
    entry = model.run_entry(task, metric, frozenset().union(*(x.kinds for x in xs))) if model is not None else None
    var, df = _run_variances(units, xs, entry)
    model_rms = math.sqrt(float(np.mean(list(var.values())))) / NOISE_TOLERANCE
    signal_floor = SIGNAL_NOISE * model_rms if is_signal(metric) else at_floor
    change = float(np.mean(list(raw.values())))
    est = t_estimate(float(np.mean(list(u.values()))), math.sqrt(sum(var.values())) / len(u), df, len(u))
    shift = change - est.mean
    pooled = broad(
        Kind.POOLED,
        *at,
        baseline=level,
        current=level + xs[0].sign * change,  # in the metric's own units
        change=change,
        n=len(u),
        p=est.p,
        floor=POOLED_FLOOR * at_floor,
        low=est.low + shift,
        high=est.high + shift,
        null="arithmetic",
    )
    scatter = dict(baseline=model_rms, floor=signal_floor, low=min(raw.values()), null="arithmetic")
    tests = _scatter_tests(u, var, df)
    return [pooled] + [broad(kind, *at, current=size, change=size, n=n, p=p, **scatter) for kind, size, n, p in tests]


def _scatter_tests(u: dict, var: dict, df: float) -> list:
    """(kind, size, units or degrees of freedom, p) of the noise test (Q = sum u^2 / V over the runs) and the spread
    test (each data set's runs around their 1/V-weighted mean over seeds, chi-square on n - 1 each)."""
    tests = []
    if len(u) > 1:
        rms, p = noise_test(list(u.values()), [var[k] for k in u], df)
        tests.append((Kind.NOISE, rms, len(u), p))
    by_set = defaultdict(list)  # a data set's runs (its seeds); one group where one run serves every set
    for k in u:
        by_set[k[:-1]].append(k)
    q = ss = dof = 0.0
    for keys in by_set.values():
        w = np.array([1 / var[k] for k in keys])
        m = float(np.dot(w, [u[k] for k in keys]) / w.sum())
        q += sum((u[k] - m) ** 2 / var[k] for k in keys)
        ss += sum((u[k] - m) ** 2 for k in keys)
        dof += len(keys) - 1
    if dof:
        tests.append((Kind.SPREAD, math.sqrt(ss / dof), int(dof), float(_f_sf(q / dof, dof, df))))
    return tests


def _run_variances(units: dict, xs: list, entry) -> tuple[dict, float]:
    """({run: the variance its mean change is allowed}, degrees of freedom): the model's variance of a run's mean
    (`entry`, floored at the run's resolution) or the correlation-free bound (the square of the mean of its
    comparisons' standard deviations), whichever has the smaller critical change at p = 1e-5: a choice that the
    model and the night's design make, never tonight's values."""
    from scipy.special import stdtrit

    bound = {k: float(np.mean([math.sqrt(x.variance) for x, _ in v])) ** 2 for k, v in units.items()}
    bound_df = min(min(x.model_df for x in xs), MAX_DF)
    if entry is None or entry.df <= 1:
        return bound, bound_df
    measured = {
        k: NOISE_TOLERANCE**2 * max(entry.ms, float(np.mean([x.resolution for x, _ in v])) ** 2 / len(v))
        for k, v in units.items()
    }

    def critical(v: dict, df: float) -> float:
        return math.sqrt(float(np.mean(list(v.values())))) * float(stdtrit(min(df, MAX_DF), 1 - 1e-5))

    if critical(measured, entry.df) < critical(bound, bound_df):
        return measured, min(entry.df, MAX_DF)
    return bound, bound_df


def _f_sf(x: float, d1: float, d2: float) -> float:
    from scipy.stats import f

    return f.sf(x, d1, min(d2, 1e7))


def _pooled_sd(groups) -> float:
    return float(math.sqrt(pooled_variance(groups)[0]))


def shift_comparisons(cells: list, floor: float, shared) -> list:
    """Per (task, metric), pooled over backbones: did its runs move one way more than the noise model allows? A run
    (a data set's seed; a seed where one run serves every set, LiT's and ImageNet-C's) is the unit, its change the
    mean over its comparisons of the reported splits, since the comparisons of one run share its arithmetic and are
    not independent signs. The exact sign test over the runs that changed, with no regard to their size (a change of
    0.24 points in each of 84 cells passes every cell test, yet all of them worse is no chance). Under the model a
    run of one precision is as likely worse as better; one across precisions (bf16 against fp32) goes the worse way
    with the share the model measured (`Noise.worse`, shrunk towards 1/2 by one pseudo-change each way), so its count
    is tested against that expectation (a Poisson binomial) rather than left out. It is worse where more runs got
    worse than expected; its magnitude floor is SHIFT_FLOOR of the usual one on the mean change, the model's sign
    bias taken off. Each test carries the smallest p it can reach (`reach`), so that `judge` leaves out of the Holm
    family a test that cannot fire."""
    runs = defaultdict(lambda: defaultdict(list))  # (task, metric) -> run -> [(change, bias, share, baseline, sign)]
    for x in cells:
        if x.split == "val" or x.null != "arithmetic" or x.p is None:
            continue
        for seed, d in x.diffs.items():
            run = (x.backbone, seed) if shared(x.task) else (x.backbone, x.dataset, seed)
            runs[(x.task, x.metric)][run].append((d, x.bias, x.worse_share, x.baseline, x.sign))
    out = []
    for (task, metric), units in sorted(runs.items()):
        u = {k: [float(np.mean([v[i] for v in vs])) for i in range(4)] for k, vs in units.items()}
        moved = {k: x for k, x in u.items() if x[0] != 0}
        if len(moved) < SHIFT_MIN:
            continue
        probs = [x[2] for x in moved.values()]
        worse = sum(x[0] < 0 for x in moved.values())
        p, reach = poisson_binomial_test(worse, probs)
        size = abs(float(np.mean([x[0] - x[1] for x in moved.values()])))
        change = -size if worse > sum(probs) else size  # worse: more runs got worse than the model expects
        level = float(np.mean([x[3] for x in u.values()]))
        sign = next(iter(units.values()))[0][4]
        backbones = sorted({k[0] for k in moved})
        out.append(
            broad(
                Kind.SHIFT,
                task,
                backbones[0] if len(backbones) == 1 else "(all)",
                metric,
                baseline=level,
                current=level + sign * change,
                change=change,
                n=len(moved),
                p=p,
                floor=SHIFT_FLOOR * floor_of(task, metric, level, floor),
                reach=reach,
            )
        )
    return out


def poisson_binomial_test(k: int, probs: list[float]) -> tuple[float, float]:
    """(p, reach): the two-sided p of `k` successes of independent trials with success probabilities `probs` (twice
    the smaller tail, at most 1), and the smallest p any outcome reaches. With every probability 1/2 it is the exact
    sign test."""
    pmf = np.array([1.0])
    for q in probs:
        pmf = np.convolve(pmf, [1 - q, q])
    low, high = pmf[: k + 1].sum(), pmf[k:].sum()
    tails = [min(1.0, 2 * min(pmf[: j + 1].sum(), pmf[j:].sum())) for j in (0, len(probs))]
    return float(min(1.0, 2 * min(low, high))), float(min(tails))
