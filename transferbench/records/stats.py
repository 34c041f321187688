"""Statistics over seeds: t-intervals, paired differences, bootstrap suite means. Pure functions.

- A metric over n seeds: mean and 95% half-width t(0.975, n-1) * s / sqrt(n), s with ddof=1;
  n = 1 has no interval.
- Against a reference backbone: per-seed paired differences (same seeds, same few-shot subsets);
  significant when their 95% interval excludes 0 (the DPN paper's bolding rule).
- Suite means (e.g. VTAB Natural): mean over datasets of the per-dataset seed means; the interval is a
  percentile bootstrap that resamples seeds within each dataset.
- What the seeds can show: the minimum detectable effect (MDE) of a paired comparison is the smallest true
  mean difference that a two-sided paired t-test on its n seeds, with their observed spread s, detects at 95%
  confidence with 80% power: the δ solving P(|T| > t(0.975, n-1)) = 0.8 for T ~ noncentral t(n-1, δ·√n/s).
- Many comparisons at once (wins / losses over datasets): Holm–Bonferroni on the paired t-tests' p-values.
- Per-example predictions (records' samples, where a comparison has no seed-to-seed variation): the exact
  McNemar test on the discordant examples, and a percentile bootstrap over examples for the interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as _scipy
from scipy.optimize import brentq

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
    mde: float | None = None  # minimum detectable effect of a paired comparison (see the module docstring)
    method: str = "seeds"  # how the interval was made: seeds (t), bootstrap (suite means), examples (samples)

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and (self.low > 0 or self.high < 0)


def mean_ci(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """Mean and t-interval half-width over seeds."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, None, 1)
    sd = float(x.std(ddof=1))
    half = float(_scipy.t.ppf(0.5 + level / 2, x.size - 1) * sd / math.sqrt(x.size))
    return Estimate(mean, half, int(x.size), mean - half, mean + half, sd=sd)


def t_pvalue(values: Sequence[float]) -> float | None:
    """Two-sided p-value of the one-sample t-test of mean 0 (a paired t-test on differences); None for n < 2."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return None
    sd = x.std(ddof=1)
    if sd == 0:
        return 1.0 if x.mean() == 0 else 0.0
    return float(2 * _scipy.t.sf(abs(x.mean()) / (sd / math.sqrt(x.size)), x.size - 1))


def mde(sd: float | None, n: int, level: float = LEVEL, power: float = 0.8) -> float | None:
    """The minimum detectable effect of a two-sided paired t-test on `n` pairs whose differences have standard
    deviation `sd`: the smallest δ > 0 with power(δ) = `power` at `level`. None for n < 2 or an unknown sd."""
    if sd is None or n < 2 or not np.isfinite(sd):
        return None
    if sd == 0:
        return 0.0
    df = n - 1
    crit = _scipy.t.ppf(0.5 + level / 2, df)

    def short(delta):
        nc = delta * math.sqrt(n) / sd
        upper, lower = _scipy.nct.sf(crit, df, nc), _scipy.nct.cdf(-crit, df, nc)
        # far in the tail scipy's noncentral t can return NaN where the probability is 0 (lower) or 1 (upper)
        return (1.0 if np.isnan(upper) else upper) + (0.0 if np.isnan(lower) else lower) - power

    high = sd
    while short(high) < 0:
        high *= 2
    return float(brentq(short, 0.0, high, xtol=1e-10 * sd))


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
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out = [False] * len(pvalues)
    m = len(tested)
    for k, (p, i) in enumerate(tested):
        if p > alpha / (m - k):
            break
        out[i] = True
    return out


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> float:
    """Exact two-sided McNemar p-value for two classifiers' per-example correctness on the same examples: a
    binomial test of the discordant pairs (a right, b wrong vs a wrong, b right) against 1/2."""
    a, b = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"per-example results of different lengths: {a.shape} vs {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    if only_a + only_b == 0:
        return 1.0
    return float(_scipy.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def paired_bootstrap(
    correct_a: Sequence[bool], correct_b: Sequence[bool], *, n_boot: int = 10_000, seed: int = 0, level: float = LEVEL
) -> Estimate:
    """100 · (accuracy of a − accuracy of b) on the same examples, with a percentile-bootstrap interval that
    resamples examples, and McNemar's p-value."""
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
        p=mcnemar(a > 0, b > 0),
        method="examples",
    )


def paired_difference(
    current: Mapping[int, float], reference: Mapping[int, float], level: float = LEVEL
) -> Estimate | None:
    """current - reference over the seeds both have; None when they share no seed."""
    seeds = sorted(set(current) & set(reference))
    if not seeds:
        return None
    diffs = [current[s] - reference[s] for s in seeds]
    e = mean_ci(diffs, level)
    return replace(e, p=t_pvalue(diffs), mde=mde(e.sd, e.n, level))


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
    current: Mapping[str, Mapping[int, float]], reference: Mapping[str, Mapping[int, float]], **kw
) -> Estimate | None:
    """Suite-mean difference from per-dataset paired per-seed differences (bootstrap as above)."""
    diffs = {}
    for ds in current:
        seeds = sorted(set(current[ds]) & set(reference.get(ds, {})))
        if not seeds:
            return None  # a dataset without paired seeds: the suite means are not comparable
        diffs[ds] = {s: current[ds][s] - reference[ds][s] for s in seeds}
    if not diffs:
        return None
    e = bootstrap_suite_mean({ds: list(v.values()) for ds, v in diffs.items()}, **kw)
    # the seeds every dataset has: per seed, the suite mean of the differences; their spread gives the MDE
    common = sorted(set.intersection(*(set(v) for v in diffs.values())))
    if len(common) < 2:
        return replace(e, method="bootstrap")
    per_seed = [float(np.mean([v[s] for v in diffs.values()])) for s in common]
    sd = float(np.std(per_seed, ddof=1))
    return replace(e, sd=sd, p=t_pvalue(per_seed), mde=mde(sd, len(common), kw.get("level", LEVEL)), method="bootstrap")


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
    return {"mean": grand, "sd": sd, "n": int(total)}
