"""What the diagnostics report reads from its records (reporting.diagnostics, reporting.diagnostics_figures): each
(task, dataset)'s forward measures, gradient logs and upstream training logs per backbone, pooled over seeds."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..cell import DIAGNOSTICS_REPORT
from ..records.record import latest
from ..records.stats import pool

DEPTH_MEASURES = {  # key -> title
    "patch_cosine": "patch cosine similarity",
    "attn_std": "attention row std",
    "token_norm": "token norm",
    "attn_distance": "mean attention distance (px, mean over heads)",
    "attn_distance_patches": "mean attention distance (patches, mean over heads)",
    "grad_norm": "gradient norm (last fine-tuning steps)",
}


def is_diagnostics(record: dict) -> bool:
    return record.get("report") == DIAGNOSTICS_REPORT


def collect(records: list[dict]) -> dict:
    """(task, dataset) -> {"order", "versions", "forward": backbone -> [diag per seed], "gradients": same}; the
    latest record of a (backbone, seed, stage) wins."""
    newest = {}
    for r in latest(records):
        if r["status"] == "ok" and is_diagnostics(r):
            newest[(r["task"], r["dataset"], r["backbone"], r["stage"], int(r["seed"]))] = r
    out: dict = {}
    for (task, ds, b, stage, _seed), r in sorted(newest.items()):
        t = out.setdefault(
            (task, ds),
            {
                "order": r.get("order", 0),
                "versions": set(),
                "pixels": defaultdict(set),
                "forward": defaultdict(list),
                "gradients": defaultdict(list),
            },
        )
        t["versions"].add(r["protocol_version"])
        if r["hparams"].get("pixels"):
            t["pixels"][b].add(r["hparams"]["pixels"])
        t[stage][b].append(r["info"]["diagnostics"])
    return out


def pooled(parts: list[dict], key: str) -> dict | None:
    """A measure pooled over seeds: {"mean", "sd", "n", "ci"} arrays (ci: 95% t half-width)."""
    have = [p[key] for p in parts if key in p]
    if not have:
        return None
    return pool(have)


def depth_curves(t: dict) -> dict:
    """measure -> backbone -> (mean per layer, ci per layer, n); attention distance averaged over heads (its
    interval: the heads' intervals averaged, a conservative band)."""
    out: dict = defaultdict(dict)
    for key in DEPTH_MEASURES:
        stage = "gradients" if key == "grad_norm" else "forward"
        for b, parts in sorted(t[stage].items()):
            p = pooled(parts, key)
            if p is None:
                continue
            mean, ci = np.asarray(p["mean"]), np.asarray(p["ci"])
            if mean.ndim == 2:  # per layer and head
                mean, ci = mean.mean(axis=1), ci.mean(axis=1)
            out[key][b] = (mean, ci, p["n"])
    return out


def upstream_logs(t: dict) -> dict:
    """backbone -> the training log of its checkpoint's pretraining (`upstream`), for those that have one."""
    return {b: u for b, parts in sorted(t["forward"].items()) if (u := first_part(parts, "upstream"))}


def first_part(parts: list[dict], key: str):
    """A weight measure (the same for every seed of a checkpoint; seed 0's for random-init)."""
    return next((p[key] for p in parts if p.get(key)), None)
