"""Statistics over seeds: t-intervals, paired differences, bootstrap suite means. Pure functions.

- A metric over n seeds: mean and 95% half-width t(0.975, n-1) * s / sqrt(n), s with ddof=1;
  n = 1 has no interval.
- Against a reference backbone: per-seed paired differences (same seeds, same few-shot subsets);
  significant when their 95% interval excludes 0 (the DPN paper's bolding rule).
- Suite means (e.g. VTAB Natural) and suite differences: mean over datasets of the per-dataset seed means. The
  interval follows what a seed is in the experiment (the task spec's `seed_scope`, docs/statistics.md):
  - `dataset` (VTAB, few-shot, high-res, ADE20K: each dataset and seed is its own run, independent of the
    other datasets'): a t-interval with the standard error of the mean of independent dataset means,
    sqrt(sum s_d^2 / n_d) / D, on Welch-Satterthwaite's degrees of freedom;
  - `task` (LiT: one text tower per seed scored on every set; ImageNet-C: one classifier per seed under every
    corruption): a t-interval over the per-seed suite means (n - 1 degrees of freedom), which holds whatever
    a seed shares across the datasets.
  The mark, the interval and the p-value of each comparison come from that one t (tests/test_stats.py checks
  their coverage by simulation at 2 to 10 seeds). The percentile bootstrap over seeds that reports once used
  (`bootstrap_suite_mean`) covers 62-86% at 2-3 seeds on independent sets, 22-53% under a shared seed effect, and
  stays only for that comparison (benchmarks/coverage.py).
- What the seeds can show: the minimum detectable effect (MDE) of a paired comparison is the smallest true
  mean difference that a two-sided paired t-test on its n seeds, with their observed spread s, detects at 95%
  confidence with 80% power: the δ solving P(|T| > t(0.975, n-1)) = 0.8 for T ~ noncentral t(n-1, δ·√n/s).
- Many comparisons at once (wins / losses over datasets): Holm–Bonferroni on the paired t-tests' p-values.
- Per-example predictions (records' samples, where a comparison has no seed-to-seed variation): a percentile
  bootstrap over examples gives the interval and, from the same resamples, the p-value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np


class _LazyScipyStats:
    """scipy.stats, imported at its first use: importing it takes over a second, which `transferbench --help` and the
    settings lookups need not pay."""

    def __getattr__(self, name: str):
        from scipy import stats

        return getattr(stats, name)


_scipy = _LazyScipyStats()


def t_ppf(q, df):
    """Student's t quantile: what `scipy.stats.t.ppf` returns (its `_ppf` is this call), without the generic
    distribution machinery's ~100 us per call, which the coverage simulations and large reports pay per estimate."""
    from scipy.special import stdtrit

    return stdtrit(df, q)


def t_sf(x, df):
    """Student's t survival function: what `scipy.stats.t.sf` returns (its `_sf` is this call)."""
    from scipy.special import stdtr

    return stdtr(df, -x)


LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    mean: float
    ci: float | None  # half-width of the 95% interval; None when it cannot be estimated (n = 1)
    n: int
    low: float | None = None
    high: float | None = None
    sd: float | None = None  # seed-to-seed standard deviation (ddof=1) of what was averaged
    p: float | None = None  # two-sided p-value of "the mean is 0" (paired differences only)
    # how the interval was made: seeds (t over seeds, or over per-seed suite means), welch (t over independent
    # dataset means), bootstrap (percentile, over seeds; not used by reports), examples (per-example samples)
    method: str = "seeds"
    df: float | None = None  # the t's degrees of freedom
    se: float | None = None  # the t's standard error
    power_df: float | None = None  # the degrees of freedom the MDE assumes, where not `df` (Welch: n - 1)

    @cached_property
    def mde(self) -> float | None:
        """The minimum detectable effect of a comparison (one with a p-value from a t): `mde_se` of its standard
        error and degrees of freedom; None for a plain estimate, one seed or no variation."""
        return mde_se(self.se, self.power_df or self.df) if self.p is not None else None

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and (self.low > 0 or self.high < 0)

    @property
    def degenerate(self) -> str | None:
        """'one seed' where there is no interval, 'no variation' where the spread is exactly 0 (an interval of
        width 0 is no evidence of precision); None otherwise."""
        if self.ci is None:
            return "one seed" if self.method != "examples" else None
        return "no variation" if self.ci == 0 else None


def mean_ci(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """Mean and t-interval half-width over seeds."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, None, 1)
    sd = float(x.std(ddof=1))
    half = float(t_ppf(0.5 + level / 2, x.size - 1) * sd / math.sqrt(x.size))
    return Estimate(mean, half, int(x.size), mean - half, mean + half, sd=sd)


def mde(sd: float | None, n: int, level: float = LEVEL, power: float = 0.8) -> float | None:
    """The minimum detectable effect of a two-sided paired t-test on `n` pairs whose differences have standard
    deviation `sd`: the smallest δ > 0 with power(δ) = `power` at `level`. None for n < 2, an unknown sd or no
    variation at all (sd 0: nothing to scale an effect by)."""
    if sd is None or n < 2 or not np.isfinite(sd) or sd == 0:
        return None
    return mde_se(sd / math.sqrt(n), n - 1, level, power)


def mde_se(se: float | None, df: float | None, level: float = LEVEL, power: float = 0.8) -> float | None:
    """The minimum detectable effect of a two-sided t-test of an estimate with standard error `se` on `df` degrees
    of freedom: the δ with P(|T| > t(level, df)) = `power` for T ~ noncentral t(df, δ / se)."""
    if se is None or df is None or not np.isfinite(se) or se <= 0 or df <= 0:
        return None
    crit = t_ppf(0.5 + level / 2, df)

    def short(delta):
        nc = delta / se
        upper, lower = _scipy.nct.sf(crit, df, nc), _scipy.nct.cdf(-crit, df, nc)
        # far in the tail scipy's noncentral t can return NaN where the probability is 0 (lower) or 1 (upper)
        return (1.0 if np.isnan(upper) else upper) + (0.0 if np.isnan(lower) else lower) - power

    high = se
    while short(high) < 0:
        high *= 2
    from scipy.optimize import brentq

    return float(brentq(short, 0.0, high, xtol=1e-10 * se))


def seeds_for(sd: float, target: float, level: float = LEVEL, power: float = 0.8, most: int = 1000) -> int | None:
    """The fewest seeds whose paired comparison has an MDE of at most `target`, given a seed-to-seed spread `sd`
    of the differences; None if more than `most` are needed."""
    for n in range(2, most + 1):
        if mde(sd, n, level, power) <= target:
            return n
    return None


def holm(pvalues: Sequence[float | None], alpha: float = 1 - LEVEL) -> list[bool]:
    """Holm–Bonferroni step-down: which hypotheses are rejected at family-wise error `alpha`. Untestable ones
    (None) are never rejected and do not count in the family."""
    if any(p is not None and not math.isfinite(p) for p in pvalues):
        raise ValueError("holm: a p-value is NaN or infinite; a test that cannot decide must say None (untested)")
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out = [False] * len(pvalues)
    m = len(tested)
    for k, (p, i) in enumerate(tested):
        if p > alpha / (m - k):
            break
        out[i] = True
    return out


def paired_bootstrap(
    correct_a: Sequence[bool], correct_b: Sequence[bool], *, n_boot: int = 10_000, seed: int = 0, level: float = LEVEL
) -> Estimate:
    """100 · (accuracy of a − accuracy of b) on the same examples, with a percentile-bootstrap interval that
    resamples examples, and the p-value of the same bootstrap (twice the smaller share of resampled differences on
    either side of 0), so that the mark, the interval and the p-value are one test's."""
    a, b = np.asarray(correct_a, dtype=np.float64), np.asarray(correct_b, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"per-example results must be non-empty and of one length: {a.shape} vs {b.shape}")
    d = 100.0 * (a - b)
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    for i in range(0, n_boot, 1000):  # in chunks: n_boot x examples indices would not fit for big test sets
        k = min(1000, n_boot - i)
        boot[i : i + k] = d[rng.integers(0, d.size, size=(k, d.size))].mean(axis=1)
    low, high = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(
        float(d.mean()),
        float(high - low) / 2,
        int(d.size),
        float(low),
        float(high),
        p=float(min(1.0, 2 * min(np.mean(boot <= 0), np.mean(boot >= 0)))),
        method="examples",
    )


def paired_difference(
    current: Mapping[int, float], reference: Mapping[int, float], level: float = LEVEL, min_sd: float = 0.0
) -> Estimate | None:
    """current - reference over the seeds both have; None when they share no seed. `min_sd` floors the seed
    spread of the differences (the metric's quantum, one example: three seeds that each lose the same one example
    have no spread, yet no evidence beyond that one example)."""
    seeds = sorted(set(current) & set(reference))
    if not seeds:
        return None
    diffs = np.array([current[s] - reference[s] for s in seeds], dtype=np.float64)
    mean = float(diffs.mean())
    if diffs.size < 2:
        return Estimate(mean, None, 1)
    sd = max(float(diffs.std(ddof=1)), float(min_sd))
    return t_estimate(mean, sd / math.sqrt(diffs.size), diffs.size - 1, int(diffs.size), level, sd=sd)


def t_estimate(mean: float, se: float, df: float, n: int, level: float = LEVEL, **kw) -> Estimate:
    """An estimate with its t-interval, its p-value of 'the true value is 0' and its MDE, all from one t on `df`
    degrees of freedom: the interval excludes 0 exactly when p < 1 - level."""
    if se == 0:  # no variation: a point, and a p-value that says only whether the point is 0
        return Estimate(mean, 0.0, n, mean, mean, p=1.0 if mean == 0 else 0.0, df=df, se=0.0, **kw)
    half = float(t_ppf(0.5 + level / 2, df) * se)
    p = float(2 * t_sf(abs(mean) / se, df))
    return Estimate(mean, half, n, mean - half, mean + half, p=p, df=df, se=se, **kw)


def suite_mean(
    per_dataset: Mapping[str, Mapping[int, float]], *, shared: bool, level: float = LEVEL, min_sd: float = 0.0
) -> Estimate:
    """The mean over datasets of each dataset's mean over seeds ({dataset: {seed: value}}), with its 95% interval:
    over the per-seed suite means where one run per seed serves every dataset (`shared`), else over independent
    dataset means (`welch_mean`). The p-value (of 'the suite mean is 0') and MDE come from the same t: for a
    suite of paired differences, that is the comparison's test. `min_sd` floors each seed spread (the metric's
    quantum, as in `paired_difference`)."""
    if not per_dataset or any(not v for v in per_dataset.values()):
        raise ValueError("suite_mean needs at least one dataset, each with at least one seed")
    if shared:
        return seed_suite_mean(per_dataset, level, min_sd=min_sd)
    return welch_mean(per_dataset, level, min_sd=min_sd)


def welch_mean(per_dataset: Mapping[str, Mapping[int, float]], level: float = LEVEL, min_sd: float = 0.0) -> Estimate:
    """Mean of independent dataset means: standard error sqrt(sum_d s_d^2 / n_d) / D, degrees of freedom by
    Welch-Satterthwaite, (sum_d v_d)^2 / sum_d v_d^2 / (n_d - 1) with v_d = s_d^2 / n_d (one dataset: its own
    t-interval). No interval where a dataset has a single seed. Each s_d is at least `min_sd`."""
    arrays = [np.asarray(list(v.values()), dtype=np.float64) for v in per_dataset.values()]
    point = float(np.mean([a.mean() for a in arrays]))
    n = min(a.size for a in arrays)
    if n < 2:
        return Estimate(point, None, n, method="welch")
    v = np.array([max(a.var(ddof=1), min_sd**2) / a.size for a in arrays])
    dfs = np.array([a.size - 1 for a in arrays], dtype=np.float64)
    se = float(math.sqrt(v.sum()) / len(arrays))
    df = float(v.sum() ** 2 / (v**2 / dfs).sum()) if v.sum() > 0 else float(dfs.sum())
    # the MDE on the fewest degrees of freedom a dataset has: Welch's df is itself estimated, and on it the test
    # reaches only 36-80% power at the MDE with few seeds; on n - 1 it has at least 80% (tests/test_stats.py)
    return t_estimate(point, se, df, n, level, method="welch", power_df=float(n - 1))


def seed_suite_mean(
    per_dataset: Mapping[str, Mapping[int, float]], level: float = LEVEL, min_sd: float = 0.0
) -> Estimate:
    """Mean over datasets where one run per seed serves every dataset: the per-seed suite means over the seeds
    every dataset has, and their t-interval on n - 1 degrees of freedom (holds whatever the datasets share). Their
    spread is at least `min_sd` / sqrt(datasets) (one example of each set)."""
    common = sorted(set.intersection(*(set(v) for v in per_dataset.values())))
    point = float(np.mean([np.mean(list(v.values())) for v in per_dataset.values()]))
    if len(common) < 2:
        return Estimate(point, None, len(common), method="seeds")
    per_seed = np.array([np.mean([v[s] for v in per_dataset.values()]) for s in common])
    sd = max(float(per_seed.std(ddof=1)), min_sd / math.sqrt(len(per_dataset)))
    mean = float(per_seed.mean())  # the suite mean over the common seeds: what the interval is about
    return t_estimate(mean, sd / math.sqrt(len(common)), len(common) - 1, len(common), level, sd=sd, method="seeds")


def bootstrap_suite_mean(
    per_dataset: Mapping[str, Sequence[float]], *, n_boot: int = 10_000, seed: int = 0, level: float = LEVEL
) -> Estimate:
    """Mean over datasets of each dataset's mean over seeds, with a percentile-bootstrap interval
    that resamples seeds (with replacement) within each dataset. `ci` is half the interval's width."""
    if not per_dataset:
        raise ValueError("bootstrap_suite_mean needs at least one dataset")
    arrays = [np.asarray(v, dtype=np.float64) for v in per_dataset.values()]
    if any(a.size == 0 for a in arrays):
        raise ValueError("every dataset needs at least one seed")
    point = float(np.mean([a.mean() for a in arrays]))
    n = min(a.size for a in arrays)
    if all(a.size < 2 for a in arrays):
        return Estimate(point, None, n)
    rng = np.random.default_rng(seed)
    boot = np.zeros(n_boot)
    for a in arrays:
        boot += a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)
    boot /= len(arrays)
    low, high = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(point, float(high - low) / 2, n, float(low), float(high))


def paired_suite_difference(
    current: Mapping[str, Mapping[int, float]],
    reference: Mapping[str, Mapping[int, float]],
    *,
    shared: bool = False,
    level: float = LEVEL,
) -> Estimate | None:
    """The suite-mean difference: `suite_mean` of the per-dataset paired per-seed differences, so that its interval,
    p-value and MDE come from one t (`shared`: one run per seed serves every dataset)."""
    diffs = {}
    for ds in current:
        seeds = sorted(set(current[ds]) & set(reference.get(ds, {})))
        if not seeds:
            return None  # a dataset without paired seeds: the suite means are not comparable
        diffs[ds] = {s: current[ds][s] - reference[ds][s] for s in seeds}
    if not diffs:
        return None
    return suite_mean(diffs, shared=shared, level=level)


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> Estimate:
    """100 · (accuracy of a − accuracy of b) on the same examples, with McNemar's exact test: under "a and b are
    equally accurate" each example that one gets right and the other wrong falls either way with probability 1/2,
    so the p-value is the two-sided binomial test of the discordant counts (no interval)."""
    a, b = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"per-example results must be non-empty and of one length: {a.shape} vs {b.shape}")
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(~a & b))
    p = 1.0 if only_a + only_b == 0 else float(_scipy.binomtest(only_a, only_a + only_b, 0.5).pvalue)
    return Estimate(100.0 * (only_a - only_b) / a.size, None, int(a.size), p=p, method="examples")


def pool(parts: list[dict]) -> dict:
    """Pool per-seed {"mean", "sd", "n"} summaries (arrays of the same shape) into one over all their samples:
    the grand mean and the standard deviation from the within- and between-part sums of squares."""
    means = [np.asarray(p["mean"], dtype=np.float64) for p in parts]
    sds = [np.asarray(p["sd"], dtype=np.float64) for p in parts]
    ns = np.asarray([p["n"] for p in parts], dtype=np.float64)
    total = ns.sum()
    grand = sum(n * m for n, m in zip(ns, means)) / total
    ss = sum((n - 1) * s**2 + n * (m - grand) ** 2 for n, m, s in zip(ns, means, sds))
    sd = np.sqrt(ss / max(total - 1, 1))
    return {"mean": grand, "sd": sd, "n": int(total), "ci": half_width(sd, int(total))}


def half_width(sd, n: int, level: float = LEVEL):
    """The t-interval's half-width t(0.5 + level/2, n-1) * sd / sqrt(n) of a mean over `n` samples whose standard
    deviation (ddof=1) is `sd` (a number or an array); NaN (of sd's shape) where n < 2."""
    if n < 2:
        return np.full_like(np.asarray(sd, dtype=np.float64), np.nan)
    return t_ppf(0.5 + level / 2, n - 1) * np.asarray(sd, dtype=np.float64) / math.sqrt(n)


def estimate(mean: float, half: float, n: int) -> Estimate:
    """An Estimate from a mean and its interval's half-width (NaN: no interval)."""
    if not np.isfinite(half):
        return Estimate(float(mean), None, n)
    return Estimate(float(mean), float(half), n, float(mean - half), float(mean + half))


MAX_DF = 1e6  # an infinite number of degrees of freedom, as a number the t-distribution takes
