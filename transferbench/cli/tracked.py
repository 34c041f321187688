"""The end of a run in its trackers, logged by the front (tracking itself draws no report): for each task, one entry
more (LOG_DIR/TASK/SUITE/report in TensorBoard; a run of job type report in the task's W&B group) holding the report's
tables (TensorBoard text in markdown; W&B tables of the rows `report --format csv` writes) and the leaderboard's
figures of the task's records folder as images."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from ..tracking import Trackers, Tracking, where


def log_task(
    tracking: Tracking | None,
    task: str,
    suite: str,
    folder: Path,
    tables: list,
    reference=None,
    figures=None,
    trackers: Trackers | None = None,
) -> None:
    """Log the report of `task` (its `tables`, and the leaderboard figures of its records folder `folder`) to each
    of the run's trackers, and say on stderr where the entries are. `figures`: the task's figures where a
    leaderboard already drew them (the nightly's); else they are drawn here. `trackers`: the command's (those that
    failed while its cells ran in this process stay off); None: a fresh one."""
    if tracking is None or not tracking.kinds or not tables:
        return
    trackers, logged = trackers or Trackers(), []
    with tempfile.TemporaryDirectory(prefix="transferbench-figures-") as tmp:
        for kind in tracking.kinds:
            args = (kind, tracking, task, suite, folder, tables, reference, Path(tmp), figures, trackers.finished)
            if trackers.guarded(kind, "logging the report", _report, *args):
                logged.append(kind)
    if logged:
        print(f"{task}: logged to {where(tracking, logged)}", file=sys.stderr)


def _report(kind, tracking, task, suite, folder, tables, reference, tmp: Path, figures, finished: list) -> bool:
    from ..reporting.formats import to_markdown, to_rows
    from ..reporting.leaderboard import write_leaderboard

    board = tmp / "LEADERBOARD.md"  # its figures are named as the leaderboard names its files (LEADERBOARD_TASK.png)
    if figures is None and not board.exists():  # drawn once, by the first tracker
        write_leaderboard([folder], board, reference=reference)
    figures = sorted(tmp.glob("*.png")) if figures is None else figures
    titles = [_title(i, t) for i, t in enumerate(tables)]
    if kind == "tensorboard":
        from ..tracking.tensorboard import report

        report(tracking, task, suite, [(title, to_markdown(t)) for title, t in zip(titles, tables)], figures)
    else:
        from ..tracking.wandb import report

        report(tracking, task, suite, [(title, to_rows(t)) for title, t in zip(titles, tables)], figures, finished)
    return True


def _title(i: int, t) -> str:
    """A table's key in the trackers: its place, task and setting, in at most 64 letters, digits and _=.,- (W&B
    names a table's artifact after it, and refuses names over 128 characters)."""
    setting = re.sub(r"[^\w=.,-]+", "_", t.setting).strip("_") if t.setting else ""
    return (f"{i + 1:02d}_{t.task}" + (f"_{setting}" if setting else ""))[:64]


def log_folder(
    tracking: Tracking | None, folder: Path, suite: str, figures: dict | None = None, trackers: Trackers | None = None
) -> None:
    """`log_task` for each task whose records lie in the records folder `folder` (the nightly's night); `figures`:
    each task's, as the night's leaderboard drew them; `trackers`: the command's."""
    if tracking is None or not tracking.kinds:
        return
    from ..records.store import load_records
    from ..reporting.kinds import report_tables

    records = load_records([folder]) if Path(folder).is_dir() else []
    for task in sorted({r["task"] for r in records}):
        mine = [r for r in records if r["task"] == task]
        shown = figures.get(task, []) if figures is not None else None
        log_task(tracking, task, suite, Path(folder) / task, report_tables(mine), figures=shown, trackers=trackers)
