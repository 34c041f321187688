"""Regression verdict between two records folders (e.g. last night's and tonight's).

Cells match on what defines the experiment — task, dataset, backbone as written, hyper-parameters,
stage, protocol version — not on checkpoint hashes, since tonight's weights are the point. For each
match and each split, the primary metric's mean over the seeds both sides have is compared: it
regresses when it gets worse by more than max(threshold, the baseline's seed-to-seed standard
deviation).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from tabulate import tabulate

from ..hashing import canon


@dataclass
class Comparison:
    task: str
    dataset: str
    backbone: str
    setting: str  # stage + hyper-parameters, for the reader
    split: str
    metric: str
    baseline: float
    current: float
    change: float  # current - baseline, signed so that > 0 is better
    tolerance: float
    n: int
    verdict: str  # regressed | improved | unchanged


def _key(r: dict) -> tuple:
    return (r["task"], r["dataset"], r["backbone"], r.get("stage", ""), canon(r["hparams"]), r["protocol_version"])


def _index(records: list[dict]) -> dict:
    """match key -> split -> seed -> value (ok records' primary metric)."""
    out = defaultdict(lambda: defaultdict(dict))
    for r in sorted(records, key=lambda r: r.get("finished_at", "")):
        out[_key(r)]  # a cell that diverged or failed still counts as present
        if r["status"] != "ok":
            continue
        for split, values in (r.get("metrics") or {}).items():
            if r["metric"] in values:
                out[_key(r)][split][int(r["seed"])] = (float(values[r["metric"]]), r["mode"], r["metric"])
    return out


def compare(baseline: list[dict], current: list[dict], threshold: float = 0.5):
    b, c = _index(baseline), _index(current)
    comparisons = []
    for key in sorted(set(b) & set(c)):
        for split in sorted(set(b[key]) & set(c[key])):
            seeds = sorted(set(b[key][split]) & set(c[key][split]))
            if not seeds:
                continue
            mode, metric = b[key][split][seeds[0]][1:]
            base = np.array([b[key][split][s][0] for s in seeds])
            cur = np.array([c[key][split][s][0] for s in seeds])
            sign = 1.0 if mode == "max" else -1.0
            change = sign * float(cur.mean() - base.mean())
            noise = float(np.std([v[0] for v in b[key][split].values()], ddof=1)) if len(b[key][split]) > 1 else 0.0
            tol = max(threshold, noise)
            verdict = "regressed" if change < -tol else "improved" if change > tol else "unchanged"
            task, dataset, backbone, stage, hp, _ = key
            comparisons.append(
                Comparison(
                    task,
                    dataset,
                    backbone,
                    f"{stage} {hp}".strip(),
                    split,
                    metric,
                    float(base.mean()),
                    float(cur.mean()),
                    change,
                    tol,
                    len(seeds),
                    verdict,
                )
            )
    missing = [k for k in b if k not in c]
    new = [k for k in c if k not in b]
    return comparisons, missing, new


def verdict(
    baseline: list[dict],
    current: list[dict],
    threshold: float = 0.5,
    *,
    fail_on_missing: bool = False,
    fail_on_failed: bool = False,
    title: str = "Regression report",
) -> tuple[str, int]:
    """(markdown report, exit code): 1 when a metric regressed, or a cell of `current` failed (with
    `fail_on_failed`: a nightly run whose cells crash must not pass), or baseline cells are missing from
    `current` (with `fail_on_missing`); else 0."""
    comparisons, missing, new = compare(baseline, current, threshold)
    failed = [r for r in current if r["status"] == "failed"]
    text = report(comparisons, missing, new, threshold, title=title, failed=failed)
    regressed = any(c.verdict == "regressed" for c in comparisons)
    return text, int(regressed or (fail_on_failed and bool(failed)) or (fail_on_missing and bool(missing)))


def report(
    comparisons: list[Comparison],
    missing: list,
    new: list,
    threshold: float,
    *,
    title: str = "Regression report",
    failed: list[dict] = (),
) -> str:
    reg = [x for x in comparisons if x.verdict == "regressed"]
    imp = [x for x in comparisons if x.verdict == "improved"]
    lines = [
        f"# {title}",
        "",
        f"**{'REGRESSION' if reg else 'OK'}**: {len(reg)} regressed, {len(imp)} improved, "
        f"{len(comparisons) - len(reg) - len(imp)} unchanged of {len(comparisons)} compared "
        f"(tolerance = max({threshold}, baseline seed std)); {len(missing)} cells missing from current, "
        f"{len(new)} new" + (f"; {len(failed)} cells of current failed" if failed else "") + ".",
        "",
    ]
    head = [
        "task",
        "dataset",
        "backbone",
        "split",
        "metric",
        "baseline",
        "current",
        "change",
        "tolerance",
        "n",
        "setting",
    ]
    for heading, rows in (("Regressions", reg), ("Improvements", imp)):
        if rows:
            lines += [
                f"## {heading}",
                "",
                tabulate(
                    [
                        [
                            x.task,
                            x.dataset,
                            x.backbone,
                            x.split,
                            x.metric,
                            f"{x.baseline:.2f}",
                            f"{x.current:.2f}",
                            f"{x.change:+.2f}",
                            f"{x.tolerance:.2f}",
                            x.n,
                            x.setting,
                        ]
                        for x in rows
                    ],
                    head,
                    tablefmt="github",
                    disable_numparse=True,
                ),
                "",
            ]
    if failed:
        lines += [
            "## Failed in current",
            "",
            tabulate(
                [
                    [r["task"], r["dataset"], r["backbone"], r.get("stage", ""), r["seed"], r.get("reason", "")]
                    for r in failed
                ],
                ["task", "dataset", "backbone", "stage", "seed", "reason"],
                tablefmt="github",
                disable_numparse=True,
            ),
            "",
        ]
    for heading, keys in (("Missing from current", missing), ("New in current", new)):
        if keys:
            lines += [f"## {heading}", ""] + [
                f"- {k[0]} / {k[1]} / {k[2]} {k[3]} {k[4]} (protocol v{k[5]})" for k in keys[:50]
            ]
            if len(keys) > 50:
                lines.append(f"- ... and {len(keys) - 50} more")
            lines.append("")
    return "\n".join(lines)
