"""Coverage of the suite-mean intervals the reports print, against the percentile bootstrap over seeds they printed
before (transferbench.records.stats): how often each 95% interval holds the true suite mean of synthetic suites.

    python -m benchmarks.coverage [--draws 2000]

Suites of D datasets (4 and 19, as VTAB's groups and all of VTAB-1k) at n seeds (2, 3, 5, 10), drawn as
- independent: each dataset's seeds independent, spreads from 0.2 to 5 across the datasets (VTAB, few-shot:
  one run per dataset and seed); the interval: Welch's t over the dataset means;
- shared: a seed effect shared by every dataset (LiT's one text tower per seed); the interval: the t over per-seed
  suite means.
The bootstrap is the same under both. Target: >= 93.5% for the intervals the reports print.
"""

from __future__ import annotations

import argparse

import numpy as np


def run(draws: int = 2000) -> list[dict]:
    from transferbench.records.stats import bootstrap_suite_mean, suite_mean

    rng = np.random.default_rng(0)
    rows = []
    for model in ("independent", "shared"):
        for d in (4, 19):
            for n in (2, 3, 5, 10):
                sd = np.geomspace(0.2, 5.0, d) if model == "independent" else np.ones(d)
                x = rng.normal(size=(draws, d, n)) * sd[None, :, None]
                if model == "shared":
                    x += 2.0 * rng.normal(size=(draws, 1, n))
                ours = boot = 0
                for a in x:
                    per = {f"d{j}": dict(enumerate(a[j])) for j in range(d)}
                    e = suite_mean(per, shared=model == "shared")
                    b = bootstrap_suite_mean({k: list(v.values()) for k, v in per.items()}, n_boot=400)
                    ours += e.low <= 0 <= e.high
                    boot += b.low <= 0 <= b.high
                rows.append(
                    {"model": model, "datasets": d, "seeds": n, "bootstrap": boot / draws, "ours": ours / draws}
                )
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| suite | datasets | seeds | percentile bootstrap (before) | the reports' interval now | target |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        now = "Welch's t over datasets" if r["model"] == "independent" else "t over per-seed suite means"
        ok = "ok" if r["ours"] >= 0.935 else "MISSED"
        out.append(
            f"| {r['model']} | {r['datasets']} | {r['seeds']} | {100 * r['bootstrap']:.1f}% | "
            f"{100 * r['ours']:.1f}% ({now}) | >= 93.5% {ok} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=2000)
    print(markdown(run(ap.parse_args().draws)))
