"""The sanity targets of the embedded world: each shipped checkpoint against random init of its own architecture.

The embedded suites are the one world that CI, the nightly and a newcomer can run, so they must answer the sanity
question as paper scale does: pretraining matters. `sanity_targets(task_tables(records))` reads the leaderboard's
sanity tables (the same paired differences over the shared seeds, the same 95% intervals) and checks each measure
of `TARGETS` for every checkpoint that has its random init beside it, and that no set of any sanity table is
significantly worse than random init. Text only: it never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tables import TaskTable, sanity_table


@dataclass(frozen=True)
class Target:
    measure: str  # what a reader calls it
    task: str
    setting: str  # the table's report-axis setting ('shots=25'), '' for a task without one
    column: str  # the column of the sanity table: a group mean or a dataset
    least: float  # the paired difference's mean must be at least this (points)


TARGETS = (
    Target("few-shot mean, 25 shots", "fewshot", "shots=25", "mean", 8.0),
    Target("few-shot mean, 10 shots", "fewshot", "shots=10", "mean", 5.0),
    Target("LiT zero-shot mean", "lit", "", "zeroshot", 10.0),
    Target("LiT retrieval mean", "lit", "", "retrieval", 5.0),
    Target("ADE20K mIoU, full fraction", "ade20k", "fraction=1.0", "mini_scenes", 5.0),
    Target("VTAB-1k mean", "vtab", "", "mean", 30.0),
)


@dataclass(frozen=True)
class Check:
    measure: str
    backbone: str  # the checkpoint ('mu4_dtn@embedded')
    reference: str  # its random init ('mu4_dtn')
    gain: float | None  # the paired difference's mean; None where the records lack the cell
    half_width: float | None
    least: float

    @property
    def ok(self) -> bool:
        return self.gain is not None and self.gain >= self.least


@dataclass(frozen=True)
class Worse:
    task: str
    setting: str
    column: str
    backbone: str
    gain: float
    half_width: float


def _sanity_tables(per_task: dict) -> dict[tuple[str, str], TaskTable]:
    """(task, setting) -> its sanity table, for the tasks whose sections print one (as `leaderboard.task_section`:
    tables of a report kind that pairs no reference, the diagnostics', have none)."""
    out = {}
    for task, (tables, report, _) in per_task.items():
        if report is not None and not report.uses_reference:
            continue
        for t in tables:
            s = sanity_table(t) if isinstance(t, TaskTable) else None
            if s is not None and s.refs and (task, t.setting) not in out:  # the newest protocol's table first
                out[(task, t.setting)] = s
    return out


def sanity_targets(per_task: dict, targets=TARGETS) -> tuple[list[Check], list[Worse]]:
    """(each target for each checkpoint, every set significantly worse than random init in any sanity table), from
    the records' tables `per_task` (`leaderboard.task_tables(records)`). The checkpoints are those with their random
    init beside them in any task; one without a cell for a target gets `gain=None`, which fails it."""
    tables = _sanity_tables(per_task)
    checkpoints: dict[str, str] = {}
    for s in tables.values():
        checkpoints.update(s.refs)
    checks = []
    for target in targets:
        s = tables.get((target.task, target.setting))
        for b, ref in sorted(checkpoints.items()):
            v = s.rows.get(b, {}).get(target.column) if s is not None else None
            d = v.delta if v is not None else None
            checks.append(
                Check(
                    target.measure,
                    b,
                    ref,
                    None if d is None else d.mean,
                    None if d is None else d.ci,
                    target.least,
                )
            )
    worse = [
        Worse(task, setting, col, b, v.delta.mean, v.delta.ci)
        for (task, setting), s in sorted(tables.items())
        for b in s.refs
        for col, v in s.rows[b].items()
        if v.worse and v.delta is not None
    ]
    return checks, worse


def targets_markdown(checks: list[Check]) -> str:
    """One row per measure, one column per checkpoint: the gain ± its 95% half-width, and whether it holds."""
    backbones = list(dict.fromkeys(c.backbone for c in checks))
    measures = list(dict.fromkeys((c.measure, c.least) for c in checks))
    by = {(c.measure, c.backbone): c for c in checks}
    lines = [
        "| measure | target | " + " | ".join(f"{b} vs {by[(measures[0][0], b)].reference}" for b in backbones) + " |"
    ]
    lines.append("|---|---|" + "---|" * len(backbones))
    for measure, least in measures:
        cells = []
        for b in backbones:
            c = by[(measure, b)]
            if c.gain is None:
                cells.append("no records ✗")
            else:
                hw = f" ± {c.half_width:.1f}" if c.half_width is not None else ""
                cells.append(f"{c.gain:+.1f}{hw} {'✓' if c.ok else '✗'}")
        lines.append(f"| {measure} | ≥ {least:+g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
