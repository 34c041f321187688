"""How values scatter, as the regression gate tests it (transferbench.gate): the sign test, the pooled within-group
variance and the F-test of two seed-to-seed spreads, whether groups moved alike (`moved_test`) and whether runs moved
beyond a model's variance (`noise_test`). Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def sign_test(worse: int, n: int) -> float:
    """Two-sided p of `worse` of `n` changes pointing one way when either way is equally likely (exact binomial)."""
    return float(scipy_stats().binomtest(worse, n, 0.5).pvalue)


def pooled_variance(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(variance, degrees of freedom) pooled over groups: the within-group sums of squares over their degrees of
    freedom (groups of one value add nothing); nan on 0 degrees of freedom."""
    arrays = [np.asarray(g, dtype=np.float64) for g in groups if len(g) > 1]
    df = sum(a.size - 1 for a in arrays)
    return (sum(((a - a.mean()) ** 2).sum() for a in arrays) / df if df else math.nan), df


def variance_ratio(current: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(ratio, p): the ratio of the seed-to-seed standard deviations current / baseline, each pooled over groups
    (within-group variances weighted by their degrees of freedom), and the two-sided F-test of "the variances are
    equal" on the pooled degrees of freedom. A spread of exactly 0 against a positive one has p = 0; nan where a
    side has no degree of freedom or both spreads are 0."""

    vc, dfc = pooled_variance(current)
    vb, dfb = pooled_variance(baseline)
    if not dfc or not dfb or (vc == 0 and vb == 0):
        return math.nan, math.nan
    if vc == 0 or vb == 0:
        return (0.0 if vc == 0 else math.inf), 0.0
    f = vc / vb
    p = 2 * min(scipy_stats().f.cdf(f, dfc, dfb), scipy_stats().f.sf(f, dfc, dfb))
    return math.sqrt(f), float(min(1.0, p))


def moved_test(groups: Sequence[Sequence[float]], min_sd: float = 0.0) -> tuple[float, float, int, int]:
    """(rms, p, df1, df2) of "every group moved alike", for groups of paired differences d_gs (a group: one data
    set's per-seed changes): the one-way ANOVA's F = (sum_g n_g (mean_g - mean)^2 / (G - 1)) / (sum_g sum_s (d_gs -
    mean_g)^2 / sum_g (n_g - 1)) on (G - 1, sum_g (n_g - 1)) degrees of freedom, mean = the seed-weighted grand
    mean: do the sets move differently from each other, more than their seeds vary? A shift of every set alike is
    the pooled test's; this one sees sets that move both ways, whatever the mean does. The within-group variance is
    at least `min_sd`^2 (the metric's quantum); rms = sqrt(mean_g (mean_g - mean)^2), the size of the unevenness.
    Fewer than two groups: no test (p 1)."""
    arrays = [np.asarray(d, dtype=np.float64) for d in groups if len(d) > 1]
    df1, df2 = len(arrays) - 1, sum(a.size - 1 for a in arrays)
    if df1 < 1:
        return 0.0, 1.0, max(df1, 0), df2
    grand = sum(a.sum() for a in arrays) / sum(a.size for a in arrays)
    between = sum(a.size * (a.mean() - grand) ** 2 for a in arrays) / df1
    within = max(sum(((a - a.mean()) ** 2).sum() for a in arrays) / df2, min_sd**2)
    rms = float(math.sqrt(np.mean([(a.mean() - grand) ** 2 for a in arrays])))
    if within == 0:
        return rms, (0.0 if between > 0 else 1.0), df1, df2
    return rms, float(scipy_stats().f.sf(between / within, df1, df2)), df1, df2


def noise_test(units: Sequence[float], variances: Sequence[float], df_model: float) -> tuple[float, float]:
    """(rms, p) of "these paired changes are what arithmetic makes them": each unit u_i (one run's mean change)
    against the noise model's mean square v_i for its kind of unit, estimated on `df_model` units of benign runs as
    the mean square of their changes around 0. Q = sum_i u_i^2 / v_i; under the model Q / N is F(N, df_model)
    distributed (N squared standard normals over the model's own chi-square estimate). The null of a paired night is
    arithmetic noise, not seed variance: a shift of every run beyond what arithmetic moves them (which a t over 3
    seeds rarely sees), runs that move several points both ways, seeds that disagree about the sign. rms = sqrt(mean
    u_i^2). Fewer than two units: no test (p 1)."""
    u = np.asarray(units, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    if u.size < 2:
        return 0.0, 1.0
    if np.any(v <= 0):
        raise ValueError("noise_test needs positive model variances")
    q = float((u**2 / v).sum())
    return float(math.sqrt(np.mean(u**2))), float(scipy_stats().f.sf(q / u.size, u.size, df_model))


def scipy_stats():
    """scipy.stats, imported on first use (it costs a second; most commands never test)."""
    from scipy import stats

    return stats
