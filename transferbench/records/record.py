"""A record's type: the JSON object one finished cell writes (records.store.record_of, schema 2), its reads and the
rule that picks one record per cell.

Records stay the plain mappings JSON reads (a record of another version keeps fields this one does not know);
`Record` declares the fields every reader may rely on, so a type checker sees a misspelt key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict


class Record(TypedDict, total=False):
    schema_version: int  # records.store.SCHEMA_VERSION; absent: 1
    task: str
    dataset: str
    backbone: str
    stage: str  # '' for a task of one stage
    seed: int
    hparams: dict[str, Any]  # the cell's hyper-parameters, `select` keys included
    select: list[str]  # the hyper-parameters a final stage chose on validation
    dataset_config: dict[str, Any]
    protocol_version: str
    metric: str  # the main metric
    mode: str  # max | min: which way the main metric is better
    order: int  # the task's report order of the dataset
    group: str | None  # the dataset's group in the report (VTAB's natural, specialized, structured)
    report: str  # the report kind (records.kinds)
    suite: str
    pretraining: str  # what the weights were pretrained on (cell.Cell.pretraining; absent in older records)
    sources: dict[str, str]  # where each setting's value came from (spec.Task.sources)
    execution: dict[str, Any]  # the execution settings it ran with (settings.EXECUTION)
    key: str  # the cell's key: the hash of what it is
    status: str  # ok | diverged | failed
    reason: str
    metrics: dict[str, dict[str, float]]  # split -> metric -> value
    info: dict[str, Any]
    samples: dict[str, str]  # split -> the per-example results' file, where logged
    seconds: float
    finished_at: str  # ISO 8601, UTC
    run_id: str
    checkpoint: str
    checkpoint_sha256: str
    data_version: str
    fingerprint: dict[str, Any]  # the code that computed it (transferbench.fingerprint)
    arithmetic: dict[str, Any]  # the arithmetic it ran in (transferbench.arithmetic)
    outputs: str  # the sha256 of its raw outputs
    caches: dict[str, Any]
    environment: dict[str, Any]


def latest(records: Iterable[Record]) -> list[Record]:
    """The records oldest first (by `finished_at`), so that wherever a later record of the same cell overwrites an
    earlier one, the latest record of a cell wins: a rerun's record replaces the one it reran."""
    return sorted(records, key=lambda r: r.get("finished_at", ""))


def value(r: Record, split: str, metric: str | None = None) -> float | None:
    """A finished (ok) record's value of `metric` (default: its main metric) on `split`; None where it has none."""
    if r["status"] != "ok":
        return None
    v = (r.get("metrics") or {}).get(split, {}).get(metric or r["metric"])
    return None if v is None else float(v)
