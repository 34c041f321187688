"""What the gate's sides are matched on and compared by (gate.match): a cell's identity (`CellKey`), one comparison
of the statistical tier (`GroupKey`), what a match finds missing, non-finite or selected otherwise, and the small
readings of a record every part of the gate shares (a metric's direction, a cell's precision, its main split, a
setting's value as text)."""

from __future__ import annotations

from typing import NamedTuple

from ..hashing import canon
from .metrics import declared


class CellKey(NamedTuple):
    """What a cell is, on either side: its axes are the canonical text of the report axes' values."""

    task: str
    dataset: str
    backbone: str
    stage: str
    seed: int
    axes: str


class GroupKey(NamedTuple):
    """One comparison of the statistical tier: a cell's seeds, on one split and metric."""

    task: str
    dataset: str
    backbone: str
    stage: str
    axes: str
    split: str
    metric: str


class TaskBackbone(NamedTuple):
    task: str
    backbone: str


class Vanished(NamedTuple):
    """A split and metric the baseline's cell holds and current's lacks."""

    cell: CellKey
    split: str
    metric: str


class NonFinite(NamedTuple):
    """A comparison's seed whose value is NaN or infinite on either side."""

    group: GroupKey
    seed: int


class Selection(NamedTuple):
    """A final stage that selected other values: the cell's axes, its selection before and after."""

    task: str
    dataset: str
    backbone: str
    axes: dict
    seed: int
    before: dict
    after: dict


def value_text(v) -> str:
    """A setting's value as canonical text: strings as they are, whole floats as `2.0`, the rest as JSON."""
    if isinstance(v, str):
        return v
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(v)
    return canon({"v": v})[5:-1] if not isinstance(v, (int, float)) else repr(v)


def direction(r: dict, metric: str) -> float:
    """+1 where higher is better (or either way counts), -1 where lower is (gate.metrics)."""
    return declared(r["task"], metric, r).sign


def precision(r: dict):
    """The precision each step of a cell ran in, as its record's arithmetic says."""
    return ((r.get("arithmetic") or {}).get("cell") or {}).get("precision")


def main_split(r: dict) -> str:
    metrics = r.get("metrics") or {}
    return "test" if "test" in metrics else next(iter(metrics), "test")
