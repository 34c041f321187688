"""From records to results: pick hyper-parameters by mean validation metric, report the test metric.

Records group by (task, dataset, backbone, hyper-parameters other than the selected ones). Within a
group, the setting of the `select` keys (e.g. the learning rate) with the best mean validation metric
over seeds wins, and the group's test metric at that setting, per seed, is the result. Hyper-parameters
that vary across a task's records without being selected (few-shot `shots`) become report columns.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..cell import RANDOM_INIT
from ..hashing import canon
from ..spec import OVERRIDE_SOURCES
from .record import Record, latest, value
from .stats import Estimate, mean_ci
from .store import read_samples


def select_best(records: list[Record], select: tuple | list, mode: str) -> dict | None:
    """The `select` setting with the best mean validation metric over seeds (None if none has one).
    Ties go to the first setting in sorted order, so the choice is deterministic."""
    by_setting = defaultdict(list)
    for r in records:
        v = value(r, "val")
        if v is not None:
            by_setting[canon({k: r["hparams"][k] for k in select})].append(v)
    if not by_setting:
        return None
    sign = 1 if mode == "max" else -1
    best = max(sorted(by_setting), key=lambda s: sign * float(np.mean(by_setting[s])))
    return json.loads(best)


@dataclass(kw_only=True)
class Entry:
    task: str
    protocol_version: str
    dataset: str
    column: str
    group: str | None
    order: int
    axes: dict
    backbone: str
    metric: str
    mode: str
    selected: dict
    per_seed: dict  # seed -> test metric
    estimate: Estimate | None
    counts: dict = field(default_factory=dict)  # status -> number of cells
    note: str = ""
    pixels: str = ""  # the input normalisation its cells used (hyper-parameter `pixels`; '' in older records)
    samples: dict = field(default_factory=dict)  # seed -> per-example test correctness, where records logged it
    # (setting, value, source) of each setting its cells took from outside the protocol's defaults: a suite, --set
    # or a rule (the records' `sources`; none in older records)
    changed: tuple = ()
    suite: str = ""  # the suite its cells ran ('' in older records)
    pretraining: str = ""  # what its weights were pretrained on (cell.Cell.pretraining; '' unknown or older records)
    settings: dict = field(default_factory=dict)  # its hyper-parameters other than the selected ones


def value_order(value) -> tuple:
    """A sort key that any two hyper-parameter values accept, whatever their types (records written by
    other versions may hold 5 and '5'): numbers by value, then everything else by its canonical text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, canon({"v": value}))


# properties of the weights, which differ between backbones: never report columns (nor is a hyper-parameter that
# a backbone's `backbone_preprocess` states for it: a timm: model's own posemb resampling)
NOT_AXES = ("pixels", "backbone_preprocess", "pretraining")


def task_axes(records: list[Record]) -> list[str]:
    """Hyper-parameters (not selected, not a property of the weights) whose values differ between a task's
    records."""
    values = defaultdict(set)
    for r in records:
        for k, v in r["hparams"].items():
            if (
                k not in r.get("select", [])
                and k not in NOT_AXES
                and k not in r["hparams"].get("backbone_preprocess", {})
            ):
                values[k].add(canon({"v": v}))
    return sorted(k for k, vs in values.items() if len(vs) > 1)


def group_key(r: Record) -> tuple:
    """(dataset, backbone, hyper-parameters other than the selected ones): the records of one result."""
    select = tuple(r.get("select", []))
    return r["dataset"], r["backbone"], canon({k: v for k, v in r["hparams"].items() if k not in select})


def aggregate(records: list[Record]) -> list[Entry]:
    """Entries of the finished (ok or diverged) records. A failed cell has no metric: it joins the
    counts of its group when one exists and is otherwise left out (a bad --set of an earlier version must
    not add a column of dashes)."""
    entries = []
    by_task = defaultdict(list)
    for r in records:  # one protocol version at a time: its hyper-parameters are the axes' domain
        by_task[(r["task"], str(r["protocol_version"]))].append(r)
    for (task, _), recs in sorted(by_task.items()):
        finished = [r for r in recs if r["status"] != "failed"]
        axes = task_axes(finished)
        groups = defaultdict(list)
        for r in finished:
            groups[group_key(r)].append(r)
        for r in recs:
            if r["status"] == "failed" and group_key(r) in groups:
                groups[group_key(r)].append(r)
        for (dataset, backbone, _), grp in sorted(groups.items(), key=lambda kv: (kv[1][0]["order"], kv[0])):
            entries.append(_entry(task, dataset, backbone, grp, axes))
    return entries


def _entry(task: str, dataset: str, backbone: str, grp: list[Record], axes: list[str]) -> Entry:
    """The entry of one group's records: the selected setting, the test metric of its latest record per seed."""
    first = grp[0]
    select = tuple(first.get("select", []))
    axis_values = {k: first["hparams"][k] for k in axes if k in first["hparams"]}
    column = dataset + (" (" + ", ".join(f"{k}={v}" for k, v in axis_values.items()) + ")" if axis_values else "")
    chosen = select_best(grp, select, first["mode"]) if select else {}
    note = ""
    if chosen is None:
        settings = {canon({k: r["hparams"][k] for k in select}) for r in grp}
        chosen = json.loads(settings.pop()) if len(settings) == 1 else None
        note = "" if chosen is not None else f"no validation metric to select {', '.join(select)}"
    per_seed, samples = _per_seed(grp, chosen) if chosen is not None else ({}, {})
    return Entry(
        task=task,
        protocol_version=first["protocol_version"],
        dataset=dataset,
        column=column,
        group=first.get("group"),
        order=first["order"],
        axes=axis_values,
        backbone=backbone,
        metric=first["metric"],
        mode=first["mode"],
        selected=chosen or {},
        per_seed=per_seed,
        estimate=mean_ci(list(per_seed.values())) if per_seed else None,
        counts={s: sum(r["status"] == s for r in grp) for s in ("ok", "diverged", "failed")},
        note=note,
        pixels=str(first["hparams"].get("pixels", "")),
        samples=samples,
        changed=changed_settings(first),
        suite=first.get("suite") or "",
        pretraining=pretraining_of(first),
        settings={k: v for k, v in first["hparams"].items() if k not in select},
    )


def _per_seed(grp: list[Record], chosen: dict) -> tuple[dict, dict]:
    """({seed: test metric}, {seed: per-example results}) of the records at the `chosen` setting; the latest record of
    a seed wins."""
    per_seed, samples = {}, {}
    finals = [r for r in grp if all(r["hparams"][k] == v for k, v in chosen.items()) and value(r, "test") is not None]
    for r in latest(finals):
        per_seed[int(r["seed"])] = value(r, "test")
        got = read_samples(r, "test") if r.get("samples") else None
        if got is not None:
            samples[int(r["seed"])] = got
    return per_seed, samples


def pretraining_of(record: Record) -> str:
    """What a record's weights were pretrained on (its cell's `pretraining`); in records older than the field,
    random init where they name no checkpoint, else '' (unknown)."""
    if record.get("pretraining"):
        return record["pretraining"]
    return RANDOM_INIT if record.get("checkpoint_sha256") == RANDOM_INIT else ""


def changed_settings(record: Record) -> tuple:
    """(setting, value, source) of each hyper-parameter the record took from a suite, --set or a rule, sorted; a
    swept setting (a column or the selection's) is left to the table."""
    sources = record.get("sources") or {}
    swept = set(record.get("select") or ())
    return tuple(
        sorted(
            (k, v if isinstance(v, (int, float, str)) else json.dumps(v, sort_keys=True), sources[k])
            for k, v in (record.get("hparams") or {}).items()
            if k in sources and k not in swept and sources[k].startswith(OVERRIDE_SOURCES)
        )
    )
