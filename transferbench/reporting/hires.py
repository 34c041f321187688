"""High-res fine-tune tables: per dataset the accuracy at the base resolution, at the high one and their paired
gain (high − base over the seeds both have, mean ± 95% t-interval), then the means over datasets (Welch's t over
the independent dataset means: one fine-tuning per set and seed); paired differences vs each row's reference
(tables.stem_references) per column.
One table per (task, base → high resolution)."""

from __future__ import annotations

from collections import defaultdict

from ..records.record import latest
from ..records.stats import mean_ci, suite_mean
from .kinds import Report
from .tables import Cellv, TaskTable, check_reference, pair, seed_counts, stem_references

PARTS = ("base", "high", "gain")


def collect(records: list[dict]) -> dict:
    """(task, base px, high px) -> {"rows": backbone -> dataset -> part -> {seed: accuracy}, "order", "versions"}."""
    out: dict = {}
    for r in latest(records):  # the latest record of a seed wins
        if r["status"] != "ok" or r.get("stage") not in ("base", "high"):
            continue
        key = (r["task"], int(r["hparams"]["base_resolution"]), int(r["hparams"]["resolution"]))
        t = out.setdefault(
            key,
            {
                "rows": defaultdict(lambda: defaultdict(lambda: defaultdict(dict))),
                "order": {},
                "versions": set(),
                "pixels": defaultdict(set),
            },
        )
        if r["hparams"].get("pixels"):
            t["pixels"][r["backbone"]].add(r["hparams"]["pixels"])
        t["rows"][r["backbone"]][r["dataset"]][r["stage"]][int(r["seed"])] = float(r["metrics"]["test"]["accuracy"])
        t["order"][r["dataset"]] = r.get("order", 0)
        t["versions"].add(r["protocol_version"])
    for t in out.values():
        for by_ds in t["rows"].values():
            for parts in by_ds.values():
                parts["gain"] = {s: parts["high"][s] - parts["base"][s] for s in parts["high"] if s in parts["base"]}
    return out


def tables(records: list[dict], reference: str | None = None) -> list[TaskTable]:
    out = []
    for (task, base, high), t in sorted(collect(records).items()):
        backbones = sorted(t["rows"])
        check_reference(reference, backbones, f"task {task!r}")
        datasets = sorted(t["order"], key=lambda d: (t["order"][d], d))
        columns = [f"{d} {p}" for d in datasets for p in PARTS]
        means = [f"mean {p}" for p in PARTS] if len(datasets) > 1 else []
        table = TaskTable(
            task=task,
            protocol_versions=sorted(t["versions"]),
            metric="accuracy, %",
            mode="max",
            columns=columns + means,
            group_columns=means,
            setting=f"base {base} px → high {high} px; gain = high − base, paired by seed",
            pixels=dict(t["pixels"]),
            members={f"mean {p}": [f"{d} {p}" for d in datasets] for p in PARTS} if means else {},
            tally=[f"{d} {p}" for d in datasets for p in ("base", "high")],
        )  # gain: not a measurement
        for b in backbones:
            mine = t["rows"][b]
            parts = ((d, p, mine.get(d, {}).get(p)) for d in datasets for p in PARTS)
            row = {f"{d} {p}": Cellv(mean_ci(list(vals.values())), seeds=dict(vals)) for d, p, vals in parts if vals}
            for p, col in zip(PARTS, means):
                if not all(mine.get(d, {}).get(p) for d in datasets):
                    continue  # a backbone missing a dataset has no comparable mean
                per = {f"{d} {p}": dict(mine[d][p]) for d in datasets}
                row[col] = Cellv(suite_mean(per, shared=False), seeds=per)  # one fine-tuning per set and seed
            table.rows[b] = row
            table.seeds[b] = seed_counts(v.estimate.n for v in row.values() if v.estimate)
        out.append(pair(table, stem_references(backbones, reference)))
    return out


KIND = Report(tables)  # entry point transferbench.reports: hires
