import math

import numpy as np
import pytest
import scipy.stats

from transferbench.records.stats import (
    bootstrap_suite_mean,
    mean_ci,
    paired_difference,
    paired_suite_difference,
    suite_mean,
)


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


def test_the_fast_t_quantile_and_tail_are_scipy_stats_t_bit_for_bit():
    """The reports' t quantile and tail skip scipy.stats' distribution machinery: the values must be the ones
    scipy.stats.t gives, to the last bit, or every interval and p-value would move."""
    from transferbench.records.stats import t_ppf, t_sf

    rng = np.random.default_rng(0)
    for df in (1, 2, 3.5, 9, 17.25, 1e4):
        for q in rng.uniform(0.5, 0.9999, 20):
            assert t_ppf(q, df) == scipy.stats.t.ppf(q, df)
        for x in rng.exponential(3.0, 20):
            assert t_sf(x, df) == scipy.stats.t.sf(x, df)
    assert t_ppf(0.975, 2) == pytest.approx(4.302652729911275)  # the printed table's t(0.975, 2)


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


def test_paired_suite_difference_by_hand():
    cur = {"a": {0: 2.0, 1: 3.0}, "b": {0: 5.0, 1: 5.0}}
    ref = {"a": {0: 1.0, 1: 1.0}, "b": {0: 4.0, 1: 4.0}}
    d = paired_suite_difference(cur, ref)
    # differences a: {1, 2}, b: {1, 1}; suite mean (1.5 + 1) / 2; v_a = 0.5 / 2, v_b = 0: se = sqrt(0.25) / 2,
    # Welch-Satterthwaite df = 0.25^2 / (0.25^2 / 1) = 1, so t(0.975, 1) = 12.706 x 0.25
    assert (d.mean, d.df, d.method) == (pytest.approx(1.25), pytest.approx(1.0), "welch")
    assert d.ci == pytest.approx(scipy.stats.t.ppf(0.975, 1) * 0.25) and not d.excludes_zero
    assert d.p == pytest.approx(2 * scipy.stats.t.sf(1.25 / 0.25, 1))
    assert paired_suite_difference({"a": {0: 1.0}}, {"b": {0: 1.0}}) is None


def test_welch_suite_mean_by_hand():
    per = {"a": {0: 70.0, 1: 72.0, 2: 71.0}, "b": {0: 50.0, 1: 52.0, 2: 56.0}}
    e = suite_mean(per, shared=False)
    va, vb = np.var([70, 72, 71], ddof=1) / 3, np.var([50, 52, 56], ddof=1) / 3
    se, df = math.sqrt(va + vb) / 2, (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    assert e.mean == pytest.approx((71 + 52.666666666666664) / 2) and e.df == pytest.approx(df)
    assert e.ci == pytest.approx(scipy.stats.t.ppf(0.975, df) * se)
    # one dataset: exactly its own t-interval
    one = suite_mean({"a": per["a"]}, shared=False)
    assert (one.ci, one.df) == (pytest.approx(mean_ci([70, 72, 71]).ci), pytest.approx(2.0))
    assert suite_mean({"a": {0: 1.0}, "b": {0: 2.0, 1: 3.0}}, shared=False).ci is None  # a dataset of one seed


def test_shared_seed_suite_mean_is_the_t_over_per_seed_means():
    per = {"a": {0: 70.0, 1: 72.0, 2: 71.0}, "b": {0: 50.0, 1: 52.0, 2: 56.0}}
    e = suite_mean(per, shared=True)
    per_seed = [60.0, 62.0, 63.5]
    assert (e.mean, e.ci, e.df) == (pytest.approx(np.mean(per_seed)), pytest.approx(mean_ci(per_seed).ci), 2)
    assert e.p == pytest.approx(scipy.stats.ttest_1samp(per_seed, 0).pvalue)


# --- what the seeds can show: MDE, Holm, per-example tests --------------------------------------------------

from transferbench.records.stats import holm, mde, paired_bootstrap, seeds_for  # noqa: E402


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
    assert mde(1.0, 1) is None and mde(None, 5) is None and mde(0.0, 3) is None  # no variation: no MDE
    # seeds needed for a target: the first n whose MDE is at most the target
    n = seeds_for(1.0, 1.0)
    assert mde(1.0, n) <= 1.0 < mde(1.0, n - 1)


def test_paired_difference_carries_p_and_mde():
    d = paired_difference({0: 1.0, 1: 2.0, 2: 4.0}, {0: 0.0, 1: 0.0, 2: 1.0})  # differences 1, 2, 3
    assert d.p == pytest.approx(scipy.stats.ttest_rel([1, 2, 4], [0, 0, 1]).pvalue, rel=1e-12)
    assert d.sd == pytest.approx(1.0) and d.mde == pytest.approx(mde(1.0, 3))
    p = lambda diffs: paired_difference(dict(enumerate(diffs)), dict.fromkeys(range(len(diffs)), 0.0)).p  # noqa: E731
    assert p([1.0]) is None and p([2.0, 2.0]) == 0.0 and p([0.0, 0.0]) == 1.0


def test_shared_seed_suite_difference_uses_per_seed_suite_means():
    cur = {"a": {0: 3.0, 1: 5.0, 2: 4.0}, "b": {0: 1.0, 1: 1.0, 2: 4.0}}
    ref = {"a": {0: 1.0, 1: 2.0, 2: 2.0}, "b": {0: 1.0, 1: 0.0, 2: 1.0}}
    d = paired_suite_difference(cur, ref, shared=True)
    # per-seed suite-mean differences: (2+0)/2, (3+1)/2, (2+3)/2 = 1, 2, 2.5
    per_seed = [1.0, 2.0, 2.5]
    assert d.sd == pytest.approx(np.std(per_seed, ddof=1)) and d.mde == pytest.approx(mde(d.sd, 3))
    assert d.p == pytest.approx(scipy.stats.ttest_1samp(per_seed, 0).pvalue)


def test_holm_rejects_as_computed_by_hand():
    # m = 4 tested: 0.01 <= 0.05/4 rejected; next 0.03 > 0.05/3: stop, so 0.04 and 0.5 stand; None is untested
    assert holm([0.01, 0.04, 0.03, None, 0.5]) == [True, False, False, False, False]
    # all small enough: 0.001 <= .0125, 0.01 <= .0167, 0.02 <= .025, 0.04 <= .05
    assert holm([0.04, 0.001, 0.02, 0.01]) == [True, True, True, True]
    assert holm([]) == []


def test_paired_bootstrap_over_examples():
    a = np.array([1] * 8 + [0] * 2 + [1] * 5, dtype=bool)
    b = np.array([0] * 8 + [1] * 2 + [1] * 5, dtype=bool)
    e = paired_bootstrap(a, b)
    assert e.mean == pytest.approx(100 * (13 - 7) / 15) and e.method == "examples" and e.n == 15
    # 8 discordant examples one way, 2 the other: the interval reaches 0 exactly and p is just above 0.05, one verdict
    assert e.low == 0.0 < e.mean < e.high and not e.excludes_zero and 0.05 < e.p < 0.06
    tie = paired_bootstrap(np.array([1, 0, 1, 1], bool), np.array([0, 1, 1, 1], bool))  # one discordant each way
    assert tie.mean == 0 and tie.low < 0 < tie.high and tie.p > 0.05
    assert paired_bootstrap(a, b) == e  # seeded


# --- coverage, by simulation: every interval the reports print holds its 95% at the seed counts we run -------------

DRAWS = 2500  # per configuration: a true 95% is seen as 95.0 ± 0.9 (2 SE); 93.5% is more than 3 SE below


def _draws(model: str, n: int, d: int, rng) -> np.ndarray:
    """(DRAWS, d, n) values around a true value of 0 (a cell, a suite mean or a difference): independent seed noise
    of equal or unequal spread per dataset (1 : 25 from the first to the last), or equal noise plus a seed effect
    shared by every dataset (one run per seed serving every set)."""
    sd = np.geomspace(0.2, 5.0, d) if model == "unequal" and d > 1 else np.ones(d)
    x = rng.normal(size=(DRAWS, d, n)) * sd[None, :, None]
    if model == "shared":
        x += 2.0 * rng.normal(size=(DRAWS, 1, n))
    return x


def _seeds(a: np.ndarray) -> dict:
    """One draw (d, n) as the reports hold it: {dataset: {seed: value}}."""
    return {f"d{j}": {s: float(a[j, s]) for s in range(a.shape[1])} for j in range(a.shape[0])}


def _covers(estimates) -> float:
    return float(np.mean([e.low <= 0.0 <= e.high for e in estimates]))


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_every_interval_covers_at_least_93_5_percent(n):
    """A single cell, a paired difference, a suite mean and a suite difference, each as the reports make it, on
    synthetic suites whose truth is known: coverage >= 93.5% everywhere its assumptions hold. Welch's t over
    datasets is for independent datasets (seed_scope: dataset); the per-seed t holds under a shared seed effect
    too (seed_scope: task). At the seed counts the suites run (3, and 2 where a seed failed): more seeds only bring
    the t-interval nearer its normal limit, and Welch's estimated degrees of freedom are least accurate with the
    fewest seeds."""
    rng = np.random.default_rng(n)
    found = {}
    for d in (1, 4, 19):
        for model in ("equal", "unequal", "shared"):
            x, y = _draws(model, n, d, rng), _draws(model, n, d, rng)
            kinds = [("per-seed", True)] + ([("welch", False)] if model != "shared" else [])
            for name, shared in kinds:
                found[(d, model, name, "suite mean")] = _covers(suite_mean(_seeds(a), shared=shared) for a in x)
                found[(d, model, name, "suite difference")] = _covers(
                    paired_suite_difference(_seeds(a), _seeds(b), shared=shared) for a, b in zip(x, y)
                )
        found[(d, "cell", "t", "cell")] = _covers(mean_ci(a[0]) for a in x)
        found[(d, "cell", "t", "paired difference")] = _covers(
            paired_difference(dict(enumerate(a[0])), dict(enumerate(b[0]))) for a, b in zip(x, y)
        )
    low = {k: v for k, v in found.items() if v < 0.935}
    assert not low, low
    assert len(found) == 3 * (2 * 2 * 2 + 2 * 1 + 2)  # every configuration was drawn


def test_the_percentile_bootstrap_the_reports_used_to_print_does_not_cover():
    """The reason for the change, kept as a number: at 3 seeds the bootstrap's 95% interval of a suite mean
    covers about 70-75%."""
    rng = np.random.default_rng(0)
    x = _draws("equal", 3, 4, rng)[:1000]
    cover = np.mean(
        [(e.low <= 0 <= e.high) for e in (bootstrap_suite_mean({j: a[j] for j in range(4)}, n_boot=400) for a in x)]
    )
    assert 0.6 < cover < 0.85


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_mde_of_a_welch_suite_mean_has_at_least_80_percent_power(n):
    """Suites of 4 independent datasets of equal or unequal spread whose true mean is the MDE the report prints for
    their true standard error: the same test (Welch's t) rejects in at least 80% of draws (Monte Carlo: -1.5%)."""
    from transferbench.records.stats import mde_se

    rng = np.random.default_rng(10 + n)
    d = 4
    for model in ("equal", "unequal"):
        sd = np.geomspace(0.2, 5.0, d) if model == "unequal" else np.ones(d)
        noise = _draws("equal", n, d, rng) * sd[None, :, None]
        e = suite_mean({f"d{j}": dict(enumerate(noise[0, j])) for j in range(d)}, shared=False)
        assert e.mde == pytest.approx(mde_se(e.se, n - 1))  # what the report prints: on n - 1 df
        target = mde_se(math.sqrt((sd**2 / n).sum()) / d, n - 1)  # the same for the true standard error
        rejects = np.mean(
            [
                suite_mean({f"d{j}": dict(enumerate(a[j])) for j in range(d)}, shared=False).excludes_zero
                for a in noise + target
            ]
        )
        assert rejects >= 0.785, (model, rejects)
