import math

import numpy as np
import pytest
import scipy.stats

from transferbench.records.stats import (bootstrap_suite_mean, mean_ci, paired_difference,
                                           paired_suite_difference)


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
