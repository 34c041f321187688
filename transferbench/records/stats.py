"""Statistics over seeds: t-intervals, paired differences, bootstrap suite means. Pure functions.

- A metric over n seeds: mean and 95% half-width t(0.975, n-1) * s / sqrt(n), s with ddof=1;
  n = 1 has no interval.
- Against a reference backbone: per-seed paired differences (same seeds, same few-shot subsets);
  significant when their 95% interval excludes 0 (the DPN paper's bolding rule).
- Suite means (e.g. VTAB Natural): mean over datasets of the per-dataset seed means; the interval is a
  percentile bootstrap that resamples seeds within each dataset.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy import stats as _scipy

LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    mean: float
    ci: float | None  # half-width of the 95% interval; None when it cannot be estimated (n = 1)
    n: int
    low: float | None = None
    high: float | None = None

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
    half = float(_scipy.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Estimate(mean, half, int(x.size), mean - half, mean + half)


def paired_difference(current: Mapping[int, float], reference: Mapping[int, float],
                      level: float = LEVEL) -> Estimate | None:
    """current - reference over the seeds both have; None when they share no seed."""
    seeds = sorted(set(current) & set(reference))
    if not seeds:
        return None
    return mean_ci([current[s] - reference[s] for s in seeds], level)


def bootstrap_suite_mean(per_dataset: Mapping[str, Sequence[float]], *, n_boot: int = 10_000, seed: int = 0,
                         level: float = LEVEL) -> Estimate:
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


def paired_suite_difference(current: Mapping[str, Mapping[int, float]], reference: Mapping[str, Mapping[int, float]],
                            **kw) -> Estimate | None:
    """Suite-mean difference from per-dataset paired per-seed differences (bootstrap as above)."""
    diffs = {}
    for ds in current:
        seeds = sorted(set(current[ds]) & set(reference.get(ds, {})))
        if not seeds:
            return None  # a dataset without paired seeds: the suite means are not comparable
        diffs[ds] = [current[ds][s] - reference[ds][s] for s in seeds]
    return bootstrap_suite_mean(diffs, **kw) if diffs else None


def pool(parts: list[dict]) -> dict:
    """Pool per-seed {"mean", "sd", "n"} summaries (arrays of the same shape) into one over all their samples:
    the grand mean and the standard deviation from the within- and between-part sums of squares."""
    means = [np.asarray(p["mean"], dtype=np.float64) for p in parts]
    sds = [np.asarray(p["sd"], dtype=np.float64) for p in parts]
    ns = np.asarray([p["n"] for p in parts], dtype=np.float64)
    total = ns.sum()
    grand = sum(n * m for n, m in zip(ns, means)) / total
    ss = sum((n - 1) * s ** 2 + n * (m - grand) ** 2 for n, m, s in zip(ns, means, sds))
    sd = np.sqrt(ss / max(total - 1, 1))
    return {"mean": grand, "sd": sd, "n": int(total)}
