"""Corruption robustness (Hendrycks & Dietterich, ICLR 2019): CE, mCE and relative mCE from per-severity
errors, the per-dataset tables (clean error, CE per corruption, mCE, relative mCE, mean ± 95% CI over model
seeds, paired differences vs a reference) and the error-vs-severity figure.

    CE_c          = 100 · Σ_s E(s, c) / Σ_s E_base(s, c)
    mCE           = mean over the corruptions of CE_c
    relative CE_c = 100 · Σ_s (E(s, c) − E_clean) / Σ_s (E_base(s, c) − E_base,clean)
    relative mCE  = mean over the corruptions of relative CE_c

E_base is AlexNet's published error on ImageNet; on any other dataset, where AlexNet's does not exist,
the row's reference backbone's mean error over its seeds (so the reference scores 100 and the others are
measured in its units). The formulas are `data.imagenet_c.mce` and `relative_mce`; this module renders them.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from ..data.imagenet_c import ALEXNET_CLEAN_ERROR, ALEXNET_ERRORS, CORRUPTIONS, FAMILIES, mce, relative_mce  # noqa: F401 (public names)
from ..records.record import latest
from ..records.stats import mean_ci
from .figures import plot_deltas
from .formats import to_markdown
from .kinds import Report
from .tables import Cellv, TaskTable, check_reference, pair, seed_counts, stem_references

SHORT = dict(
    zip(
        CORRUPTIONS,
        (
            "gauss",
            "shot",
            "impulse",
            "defocus",
            "glass",
            "motion",
            "zoom",
            "snow",
            "frost",
            "fog",
            "bright",
            "contrast",
            "elastic",
            "pixel",
            "jpeg",
        ),
    )
)
CLEAN, MCE, REL_MCE = "clean err", "mCE", "rel. mCE"


# --- records -> tables ------------------------------------------------------------------------------------


def _collect(records: list[dict]) -> dict:
    """(task, dataset) -> backbone -> {"clean": {seed: err}, "sev": {corruption: {seed: [e1..e5]}}, ...}."""
    out: dict = defaultdict(lambda: defaultdict(lambda: {"clean": {}, "sev": defaultdict(dict)}))
    meta: dict = {}
    for r in latest(records):  # the latest record of a seed wins
        if r["status"] != "ok":
            continue
        test = (r.get("metrics") or {}).get("test", {})
        d = out[(r["task"], r["dataset"])][r["backbone"]]
        if r["stage"] == "classifier":
            d["clean"][int(r["seed"])] = float(test["error"])
        elif r["stage"] == "corruption":
            d["sev"][r["hparams"]["corruption"]][int(r["seed"])] = [float(test[f"error_{s}"]) for s in range(1, 6)]
        m = meta.setdefault(
            (r["task"], r["dataset"]),
            {
                "versions": set(),
                "order": r.get("order", 0),
                "baseline": (r.get("dataset_config") or {}).get("baseline", "reference"),
            },
        )
        m["versions"].add(r["protocol_version"])
        if r["hparams"].get("pixels"):
            m.setdefault("pixels", defaultdict(set))[r["backbone"]].add(r["hparams"]["pixels"])
    return {k: (v, meta[k]) for k, v in out.items()}


def _per_seed(d: dict, base: dict | None, base_clean: float | None) -> dict:
    """column -> {seed: value}: clean error; per corruption its CE (or its mean error without a baseline);
    mCE and relative mCE for the seeds that have every corruption."""
    cols = {CLEAN: dict(d["clean"])}
    corrs = [c for c in CORRUPTIONS if c in d["sev"]]
    for c in corrs:
        cols[SHORT[c]] = {
            s: (100.0 * float(np.mean(e)) / base[c] if base else float(np.mean(e))) for s, e in d["sev"][c].items()
        }
    if base and len(corrs) == len(CORRUPTIONS):
        seeds = set.intersection(*(set(d["sev"][c]) for c in corrs))
        cols[MCE] = {s: mce({c: d["sev"][c][s] for c in corrs}, base)["mce"] for s in sorted(seeds)}
        rel_seeds = seeds & set(d["clean"])
        cols[REL_MCE] = {
            s: relative_mce({c: d["sev"][c][s] for c in corrs}, d["clean"][s], base, base_clean)["relative_mce"]
            for s in sorted(rel_seeds)
        }
    return cols


def baseline_for(kind: str, ref: dict | None) -> tuple[dict | None, float | None, str]:
    """Per-corruption baseline mean errors (percent), baseline clean error, and the table's words for it."""
    if kind == "alexnet":
        return (
            {c: 100.0 * v for c, v in ALEXNET_ERRORS.items()},
            100.0 * ALEXNET_CLEAN_ERROR,
            "CE normalised by AlexNet's published errors",
        )
    if ref is None:
        return None, None, "no reference backbone to normalise by: mean top-1 error (%) per corruption, not CE"
    base = {c: float(np.mean([np.mean(e) for e in ref["sev"][c].values()])) for c in CORRUPTIONS if c in ref["sev"]}
    clean = float(np.mean(list(ref["clean"].values()))) if ref["clean"] else None
    return base, clean, None


def tables(records: list[dict], reference: str | None = None) -> list[TaskTable]:
    """Per (task, dataset): rows backbones, columns clean error, the 15 corruptions, mCE and relative mCE; lower is
    better. Each row is paired with its reference (tables.stem_references). Where CE is normalised by a reference
    backbone (every dataset but ImageNet), each reference gets a table of its own, in its own units (it scores
    100), holding the rows compared with it; backbones with no reference share one table of mean errors."""
    out = []
    for (task, dataset), (by_backbone, meta) in sorted(
        _collect(records).items(), key=lambda kv: (kv[0][0], kv[1][1]["order"], kv[0][1])
    ):
        backbones = sorted(by_backbone)
        check_reference(reference, backbones, f"task {task!r} dataset {dataset!r}")
        refs = stem_references(backbones, reference)
        if meta["baseline"] == "alexnet":
            parts = [(None, backbones)]
        else:
            parts = [(r, [r] + [b for b in backbones if refs.get(b) == r]) for r in sorted(set(refs.values()))]
            rest = [b for b in backbones if b not in refs and b not in refs.values()]
            parts += [(None, rest)] if rest else []
        for ref_name, members in parts:
            chosen = "; choose another with --reference" if ref_name and reference is None else ""
            base, base_clean, words = baseline_for(meta["baseline"], by_backbone.get(ref_name) if ref_name else None)
            if words is None:
                words = f"CE normalised by {ref_name}'s mean errors (100 = {ref_name}{chosen})"
            out.append(
                _dataset_table(
                    task,
                    dataset,
                    meta,
                    {b: by_backbone[b] for b in members},
                    base,
                    base_clean,
                    words,
                    {b: r for b, r in refs.items() if b in members and r in members},
                )
            )
    return out


def _dataset_table(task, dataset, meta, by_backbone, base, base_clean, words, refs) -> TaskTable:
    per = {b: _per_seed(d, base, base_clean) for b, d in by_backbone.items()}
    present = [c for c in [CLEAN, *(SHORT[c] for c in CORRUPTIONS), MCE, REL_MCE] if any(c in p for p in per.values())]
    groups = [c for c in (MCE, REL_MCE) if c in present]
    t = TaskTable(
        task=task,
        protocol_versions=sorted(meta["versions"]),
        metric="top-1 error / CE, %",
        mode="min",
        columns=present,
        group_columns=groups,
        setting=f"{dataset}; {words}",
        pixels={b: v for b, v in meta.get("pixels", {}).items() if b in by_backbone},
        tally=[c for c in present if c not in groups],
    )
    for b in sorted(by_backbone):
        row = {}
        for col in present:
            vals = per[b].get(col)
            if vals and all(np.isfinite(list(vals.values()))):
                row[col] = Cellv(mean_ci(list(vals.values())), seeds=dict(vals))
        t.rows[b] = row
        t.seeds[b] = seed_counts(v.estimate.n for v in row.values())
    missing = [b for b in by_backbone if MCE not in t.rows[b] and base]
    if missing:
        t.notes.append(f"no mCE for {', '.join(missing)}: not every one of the 15 corruptions has a result")
    if meta["baseline"] == "alexnet":
        t.notes.append(f"AlexNet clean error {100 * ALEXNET_CLEAN_ERROR:.2f}% (relative mCE)")
    return pair(t, refs)


def severity_curves(records: list[dict], task: str, dataset: str) -> dict:
    """backbone -> family -> [(mean, ci half-width) at severity 0 (clean), 1, ..., 5]: the family's mean top-1
    error per seed, then mean and t-interval over seeds."""
    collected = _collect([r for r in records if r["task"] == task and r["dataset"] == dataset])
    if (task, dataset) not in collected:
        return {}
    out = {}
    for b, d in collected[(task, dataset)][0].items():
        out[b] = {}
        for fam, members in FAMILIES.items():
            have = [c for c in members if c in d["sev"]]
            if not have:
                continue
            seeds = sorted(set.intersection(*(set(d["sev"][c]) for c in have)) & set(d["clean"]))
            if not seeds:
                continue
            points = [mean_ci([d["clean"][s] for s in seeds])]
            for k in range(5):
                points.append(mean_ci([float(np.mean([d["sev"][c][s][k] for c in have])) for s in seeds]))
            out[b][fam] = [(p.mean, p.ci or 0.0) for p in points]
    return out


def plot_severity(records: list[dict], task: str, dataset: str, path) -> object:
    """Top-1 error vs severity (0 = clean) per corruption family, one line per backbone, 95% error bars."""
    from .figures import colour, finish, pyplot

    plt = pyplot()
    curves = severity_curves(records, task, dataset)
    if not curves:
        return None
    fig, axes = plt.subplots(1, len(FAMILIES), figsize=(3.2 * len(FAMILIES), 3.2), sharey=True)
    for ax, fam in zip(axes, FAMILIES):
        for i, (b, fams) in enumerate(sorted(curves.items())):
            if fam not in fams:
                continue
            ys, errs = zip(*fams[fam])
            ax.errorbar(
                np.arange(6) + (i - (len(curves) - 1) / 2) * 0.06,
                ys,
                yerr=errs,
                marker="o",
                ms=3,
                capsize=2,
                color=colour(b),
                label=b,
            )
        ax.set_title(f"{fam} ({', '.join(SHORT[c] for c in FAMILIES[fam])})", fontsize=8)
        ax.set_xticks(range(6))
        ax.set_xticklabels(["clean", "1", "2", "3", "4", "5"])
        ax.set_xlabel("severity")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("top-1 error (%)")
    fig.suptitle(f"{task} / {dataset}: error vs severity, mean ± 95% CI over seeds", fontsize=9)
    return finish(fig, path, axes[-1])


def leaderboard_section(records: list[dict], tables_: list, task: str, out) -> list[str]:
    """Per dataset: its table, the error-vs-severity figure and the Δ figure."""
    lines = []
    datasets = [x.setting.split(";")[0] for x in tables_]
    for x, dataset in zip(tables_, datasets):
        slug = (
            dataset
            if datasets.count(dataset) == 1
            else f"{dataset}_{re.sub(r'[^A-Za-z0-9]+', '_', x.reference or 'unpaired')}"
        )  # a table per reference
        lines += [
            f"### {dataset}" + (f" (against {x.reference})" if slug != dataset and x.reference else ""),
            "",
            to_markdown(x, title=False),
        ]
        png = plot_severity(
            [r for r in records if r["backbone"] in x.rows], task, dataset, out.parent / f"{out.stem}_{task}_{slug}.png"
        )
        if png:
            lines += [f"![error vs severity, {dataset}]({png.name})", ""]
        png = plot_deltas(x, out.parent / f"{out.stem}_{task}_{slug}_delta.png", own_axis=(REL_MCE,))
        if png:
            lines += [f"![Δ vs {x.reference}, {dataset}]({png.name})", ""]
    return lines


KIND = Report(tables, section=leaderboard_section)  # entry point transferbench.reports: corruption
