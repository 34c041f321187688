import math

import numpy as np
import pytest
import scipy.stats

from transferbench.records.stats import bootstrap_suite_mean, mean_ci, paired_difference, paired_suite_difference


def test_mean_ci_by_hand():
    e = mean_ci([1.0, 2.0, 3.0])
    # s = 1, t(0.975, 2) = 4.30265273 (t table, 9 digits), half-width = t / sqrt(3)
    assert e.mean == 2.0 and e.n == 3
    assert e.ci == pytest.approx(4.30265273 / math.sqrt(3), rel=1e-9)


@pytest.mark.parametrize("values", [[71.2, 73.9, 72.5], [0.1, 0.4], [5, 6, 9, 1, 3, 3, 8, 7, 7, 2]])
def test_mean_ci_matches_scipy_t_interval(values):
    e = mean_ci(values)
    low, high = scipy.stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=scipy.stats.sem(values))
    assert (e.low, e.high) == (pytest.approx(low, rel=1e-12), pytest.approx(high, rel=1e-12))
    assert e.ci == pytest.approx((high - low) / 2, rel=1e-12)


def test_single_seed_has_no_interval():
    e = mean_ci([76.5])
    assert (e.mean, e.ci, e.n, e.low) == (76.5, None, 1, None)
    assert not e.excludes_zero
    with pytest.raises(ValueError):
        mean_ci([])


def test_paired_difference_uses_common_seeds_only():
    cur = {0: 80.0, 1: 82.0, 2: 81.0, 3: 99.0}
    ref = {0: 79.0, 1: 80.0, 2: 80.0}
    d = paired_difference(cur, ref)
    # differences 1, 2, 1: mean 4/3, s = sqrt(1/3)
    assert d.n == 3 and d.mean == pytest.approx(4 / 3)
    assert d.ci == pytest.approx(4.30265273 * math.sqrt(1 / 3) / math.sqrt(3), rel=1e-9)
    assert not d.excludes_zero  # with 3 seeds t = 4.30: the interval is [-0.10, 2.77]
    assert paired_difference({5: 1.0}, {6: 1.0}) is None


def test_paired_difference_significance_matches_scipy_paired_t_test():
    rng = np.random.default_rng(0)
    for _ in range(50):
        ref = rng.normal(70, 1, 5)
        cur = ref + rng.normal(0.5, 1, 5)
        d = paired_difference(dict(enumerate(cur)), dict(enumerate(ref)))
        p = scipy.stats.ttest_rel(cur, ref).pvalue
        assert d.excludes_zero == (p < 0.05)


def test_bootstrap_of_two_seeds_by_hand():
    # seeds {0, 1}: a resample's mean is 0, .5 or 1 with probability 1/4, 1/2, 1/4, so the 2.5% and
    # 97.5% quantiles are 0 and 1
    e = bootstrap_suite_mean({"a": [0.0, 1.0]}, n_boot=20_000, seed=3)
    assert (e.mean, e.low, e.high, e.ci) == (0.5, 0.0, 1.0, 0.5)


def test_bootstrap_suite_mean_is_seeded_and_averages_datasets():
    per = {"a": [70.0, 72.0, 71.0], "b": [50.0, 50.0, 50.0], "c": [90.0]}
    e1, e2 = bootstrap_suite_mean(per, seed=1), bootstrap_suite_mean(per, seed=1)
    assert e1 == e2
    assert e1.mean == pytest.approx((71 + 50 + 90) / 3)
    # only dataset a varies: the suite mean moves by a third of a's bootstrap mean, within [70, 72] / 3
    assert e1.low >= (70 + 50 + 90) / 3 - 1e-9 and e1.high <= (72 + 50 + 90) / 3 + 1e-9
    assert bootstrap_suite_mean({"a": [1.0], "b": [2.0]}).ci is None


def test_paired_suite_difference():
    cur = {"a": {0: 2.0, 1: 3.0}, "b": {0: 5.0, 1: 5.0}}
    ref = {"a": {0: 1.0, 1: 1.0}, "b": {0: 4.0, 1: 4.0}}
    d = paired_suite_difference(cur, ref, n_boot=4000)
    # differences a: {1, 2}, b: {1, 1}; suite mean = (1.5 + 1) / 2, bootstrap over a gives [1, 1.5]
    assert d.mean == pytest.approx(1.25) and d.low == pytest.approx(1.0) and d.high == pytest.approx(1.5)
    assert d.excludes_zero
    assert paired_suite_difference({"a": {0: 1.0}}, {"b": {0: 1.0}}) is None


# --- what the seeds can show: MDE, Holm, per-example tests --------------------------------------------------

from transferbench.records.stats import holm, mcnemar, mde, paired_bootstrap, seeds_for, t_pvalue  # noqa: E402


@pytest.mark.parametrize("n", [3, 5, 10])
def test_mde_is_where_a_paired_t_test_has_80_percent_power(n):
    """Independent of the noncentral t: simulate paired experiments whose true difference is the MDE and count
    how often scipy's one-sample t-test rejects at 5%: 80% (to Monte Carlo error, 20,000 runs: ±0.6%)."""
    sd = 2.5
    delta = mde(sd, n)
    rng = np.random.default_rng(0)
    diffs = rng.normal(delta, sd, size=(20_000, n))
    p = scipy.stats.ttest_1samp(diffs, 0.0, axis=1).pvalue
    assert (p < 0.05).mean() == pytest.approx(0.80, abs=0.012)
    # and the noncentral t at the MDE gives exactly 0.8
    crit, nc = scipy.stats.t.ppf(0.975, n - 1), delta * math.sqrt(n) / sd
    power = scipy.stats.nct.sf(crit, n - 1, nc) + scipy.stats.nct.cdf(-crit, n - 1, nc)
    assert power == pytest.approx(0.8, abs=1e-8)


def test_mde_approaches_the_normal_formula_and_scales_with_sd():
    # many seeds: (z_0.975 + z_0.8) * s / sqrt(n) = (1.959964 + 0.841621) * s / sqrt(n)
    assert mde(1.0, 2000) == pytest.approx(2.801585 / math.sqrt(2000), rel=2e-3)
    assert mde(3.0, 4) == pytest.approx(3 * mde(1.0, 4), rel=1e-9)
    assert mde(1.0, 1) is None and mde(None, 5) is None and mde(0.0, 3) == 0.0
    # seeds needed for a target: the first n whose MDE is at most the target
    n = seeds_for(1.0, 1.0)
    assert mde(1.0, n) <= 1.0 < mde(1.0, n - 1)


def test_paired_difference_carries_p_and_mde():
    d = paired_difference({0: 1.0, 1: 2.0, 2: 4.0}, {0: 0.0, 1: 0.0, 2: 1.0})  # differences 1, 2, 3
    assert d.p == pytest.approx(scipy.stats.ttest_rel([1, 2, 4], [0, 0, 1]).pvalue, rel=1e-12)
    assert d.sd == pytest.approx(1.0) and d.mde == pytest.approx(mde(1.0, 3))
    assert t_pvalue([1.0]) is None and t_pvalue([2.0, 2.0]) == 0.0 and t_pvalue([0.0, 0.0]) == 1.0


def test_suite_difference_mde_uses_per_seed_suite_means():
    cur = {"a": {0: 3.0, 1: 5.0, 2: 4.0}, "b": {0: 1.0, 1: 1.0, 2: 4.0}}
    ref = {"a": {0: 1.0, 1: 2.0, 2: 2.0}, "b": {0: 1.0, 1: 0.0, 2: 1.0}}
    d = paired_suite_difference(cur, ref)
    # per-seed suite-mean differences: (2+0)/2, (3+1)/2, (2+3)/2 = 1, 2, 2.5
    per_seed = [1.0, 2.0, 2.5]
    assert d.sd == pytest.approx(np.std(per_seed, ddof=1)) and d.mde == pytest.approx(mde(d.sd, 3))
    assert d.p == pytest.approx(scipy.stats.ttest_1samp(per_seed, 0).pvalue)


def test_holm_by_hand():
    # m = 4 tested: 0.01 <= 0.05/4 rejected; next 0.03 > 0.05/3: stop, so 0.04 and 0.5 stand; None is untested
    assert holm([0.01, 0.04, 0.03, None, 0.5]) == [True, False, False, False, False]
    # all small enough: 0.001 <= .0125, 0.01 <= .0167, 0.02 <= .025, 0.04 <= .05
    assert holm([0.04, 0.001, 0.02, 0.01]) == [True, True, True, True]
    assert holm([]) == []


def test_mcnemar_exact_by_hand():
    a = np.array([1] * 8 + [0] * 2 + [1] * 5, dtype=bool)  # 8 right only for a, 2 only for b, 5 both
    b = np.array([0] * 8 + [1] * 2 + [1] * 5, dtype=bool)
    # two-sided exact binomial on 10 discordant pairs: 2 * P(X <= 2) = 2 * (1 + 10 + 45) / 1024
    assert mcnemar(a, b) == pytest.approx(112 / 1024)
    assert mcnemar(a, a) == 1.0
    with pytest.raises(ValueError):
        mcnemar(a, b[:-1])


def test_paired_bootstrap_over_examples():
    a = np.array([1] * 8 + [0] * 2 + [1] * 5, dtype=bool)
    b = np.array([0] * 8 + [1] * 2 + [1] * 5, dtype=bool)
    e = paired_bootstrap(a, b)
    assert e.mean == pytest.approx(100 * (13 - 7) / 15) and e.method == "examples" and e.n == 15
    assert e.low < e.mean < e.high and e.p == pytest.approx(112 / 1024)
    assert paired_bootstrap(a, b) == e  # seeded
