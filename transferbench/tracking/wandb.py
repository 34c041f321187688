"""Weights & Biases: each cell a run, offline unless asked otherwise (`wandb sync LOG_DIR/wandb/offline-run-*`
uploads later), named TASK/SUITE/BACKBONE/DATASET STAGE [SWEPT] seedN KEY in the group TASK/SUITE (so a sweep's cells
compare in one view), job type the cell's stage. Config: the cell's identity, its settings and their sources.
History: TAG/loss and TAG/lr against TAG/step (TAG: curve, curve_2, ... one per training loop). Summary: SPLIT/METRIC,
wall_s, status (a cell that did not finish ok is a failed W&B run). No console capture, no system metrics and, offline,
no error reports: the run holds what the cell did.

W&B writes under the log folder alone (`confine`): its runs and their debug logs in LOG_DIR/wandb, its service's
logs, cache, artifact staging and artifacts in LOG_DIR/wandb/state. The report's tables are media files of their run
(bound before they are logged, so no artifact holds a copy by absolute path): the folder, copied elsewhere, holds
everything. W&B's own logging writes each run's debug.log; where that fails (a full disk) Python's logging would print
a traceback per line, so W&B's handlers report to `log_failures()` instead, which `Trackers.guarded` turns into the
tracker's one warning."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .entries import Tracking, final_metrics, plain, wandb_name


def _settings(wandb):
    return wandb.Settings(
        console="off", x_disable_stats=True, silent=True, disable_git=True, save_code=False, x_save_requirements=False
    )


MINIMUM = (0, 19, 10)  # wandb.init(reinit="create_new"): one run per cell in a long-lived worker


def _finish(run, finished: list, exit_code: int = 0) -> None:
    """Finish `run` and return once its file is whole. W&B's service process writes a run's file after `finish`
    returns; shutting the service down waits for it. So an entry is complete on disk when its cell's record is
    written, in the driver, in a pool worker (which ends through os._exit, where W&B's own exit hook never runs) and
    in a Ray worker (which may be stopped once the run ends). The next run starts the service again (0.2 s). A W&B
    run the caller holds open in this process keeps the service up; W&B completes the files when it ends."""
    import wandb

    run.finish(exit_code=exit_code)
    finished.append((run.name, _folder(run)))  # the process's Trackers.finished
    if wandb.setup().most_recent_active_run is None:
        wandb.teardown()


def _folder(run) -> Path:
    """A run's folder (LOG_DIR/wandb/offline-run-...): its files folder's parent."""
    return Path(run.dir).parent


def _label(run) -> str:
    """A run as a warning names it: its name and its folder."""
    return f"{run.name} ({_folder(run)})"


def unfinished(finished: list, limit: int = 8) -> list[str]:
    """The last `limit` runs this process finished (`finished`: (name, folder), oldest first) whose files do not read
    as ended in W&B's own inspector (`wandb leet inspect`), oldest first, as 'NAME (FOLDER)': on a full disk W&B's
    service can lose a run's records although `finish` returned, and a later run can still end whole (a small one),
    so each is looked at. Asked only once the tracker has failed (each look takes about a second)."""
    ended = ("finished", "failed")
    return [f"{name} ({folder})" for name, folder in finished[-limit:] if _run_state(folder) not in ended]


def _run_state(folder: Path) -> str:
    """A run folder's state as W&B's inspector reads it: finished, failed, running, or unknown (no run record)."""
    import json
    import subprocess
    import sys

    argv = [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(folder)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout
        return str(json.loads(out).get("state") or "unknown")
    except (OSError, subprocess.SubprocessError, ValueError):
        return "unknown"


# W&B's folders outside its runs (the service's logs, its cache, artifact staging, downloaded artifacts), each taken
# by its environment variable, under LOG_DIR/wandb/state; W&B's config folder is read only, and stays the user's
STATE = {"WANDB_CACHE_DIR": "cache", "WANDB_DATA_DIR": "data", "WANDB_ARTIFACT_DIR": "artifacts"}


def _state_dir(folder: Path) -> Path:
    return Path(folder).absolute() / "wandb" / "state"


def log_failures() -> list:
    """W&B's own log lines that could not be written in this process (a full disk): (handler's file, error), newest
    last. They are kept on W&B's logger, whose handlers report them (`_quiet`) and which lives as long as the
    process."""
    logger = logging.getLogger("wandb")
    if not hasattr(logger, "transferbench_failures"):
        logger.transferbench_failures = []
    return logger.transferbench_failures


def import_wandb(folder: Path):
    """The wandb package, imported with Python's temporary folder pointed under `folder`/wandb/state/tmp for the
    import alone: W&B makes folders there as it is imported (for media and artifact files), which a pool worker
    ending through os._exit would otherwise leave in the system's /tmp. Imported already: as it is."""
    import sys
    import tempfile

    if sys.modules.get("wandb") is not None:
        return sys.modules["wandb"]
    tmp = _state_dir(folder) / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    before = tempfile.tempdir
    tempfile.tempdir = str(tmp)
    try:
        import wandb
    finally:
        tempfile.tempdir = before
    return wandb


def confine(folder: Path) -> None:
    """W&B's state folders under `folder`/wandb/state (set before W&B's service starts: it reads them then), and its
    logger's file handlers quiet on failure (`log_failures()`)."""
    for variable, name in STATE.items():
        os.environ[variable] = str(_state_dir(folder) / name)
    logger = logging.getLogger("wandb")
    for handler in logger.handlers:
        _quiet(handler)
    if not getattr(logger.addHandler, "quiet", False):
        add = logger.addHandler

        def quiet_add(handler):
            add(_quiet(handler))

        quiet_add.quiet = True
        logger.addHandler = quiet_add


def _quiet(handler: logging.Handler) -> logging.Handler:
    """`handler` with its failures recorded in `log_failures()` instead of printed (logging.Handler.handleError)."""

    def note(record):
        import sys

        error = sys.exc_info()[1]
        log_failures().append((getattr(handler, "baseFilename", "?"), error))

    handler.handleError = note
    return handler


def _init(tracking: Tracking, **kwargs):
    wandb = import_wandb(tracking.dir)
    if tracking.wandb_mode() == "offline":  # offline means nothing leaves: W&B's own error reports neither
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    folder = Path(tracking.dir)
    folder.mkdir(parents=True, exist_ok=True)
    confine(folder)
    return wandb.init(
        project=tracking.project,
        entity=tracking.entity,
        dir=str(folder),
        mode=tracking.wandb_mode(),
        reinit="create_new",
        settings=_settings(wandb),
        **kwargs,
    )


class CellRun:
    """One cell's W&B run."""

    def __init__(self, tracking: Tracking, cell, settings: list[tuple], finished: list):
        identity = {
            "task": cell.task,
            "suite": cell.suite,
            "dataset": cell.dataset,
            "backbone": cell.backbone,
            "stage": cell.stage,
            "seed": cell.seed,
            "key": cell.key,
            "protocol_version": cell.protocol_version,
        }
        self.run = _init(
            tracking,
            name=wandb_name(cell, tracking.swept),
            group=tracking.group_of(cell.task, cell.suite),
            job_type=cell.stage or "cell",
            config={
                "cell": identity,
                "settings": {k: v for k, v, _ in settings},
                "sources": {k: s for k, _, s in settings},
            },
        )
        self.tags: set = set()
        self.finished = finished  # the process's Trackers.finished
        self.name = _label(self.run)  # for a warning

    def curve(self, tag: str, steps: list, losses: list, lrs: list) -> None:
        if tag not in self.tags:
            self.run.define_metric(f"{tag}/step")
            self.run.define_metric(f"{tag}/*", step_metric=f"{tag}/step")
            self.tags.add(tag)
        for step, loss, lr in zip(steps, losses, lrs):
            self.run.log({f"{tag}/step": step, f"{tag}/loss": loss, f"{tag}/lr": lr})

    def abandon(self) -> None:
        _finish(self.run, self.finished, exit_code=1)  # W&B marks it failed

    def close(self, outcome: dict, loops: dict) -> None:
        metrics = final_metrics(outcome)
        self.run.summary.update(
            {
                **metrics,
                "wall_s": outcome.get("seconds", 0.0),
                "status": outcome.get("status", ""),
                "reason": outcome.get("reason") or "",
                "loops": {t: d for d, t in loops.items()},
            }
        )
        _finish(self.run, self.finished, exit_code=0 if outcome.get("status") == "ok" else 1)


def report(
    tracking: Tracking, task: str, suite: str, tables: list[tuple[str, list[dict]]], figures: list[Path], finished: list
):
    """The run's report of `task`: one run (job type report) in the task's group, each table a wandb.Table of its
    rows, each figure a wandb.Image; the run is added to `finished` (the process's Trackers.finished)."""
    import wandb

    name, group = f"{task}/{suite or 'all'}/report", tracking.group_of(task, suite)
    run = _init(tracking, name=name, group=group, job_type="report")
    failed = None
    try:
        for step, (title, rows) in enumerate(tables):
            columns = list(dict.fromkeys(k for row in rows for k in row))
            data = [[plain(row.get(c)) for c in columns] for row in rows]
            table = wandb.Table(columns=columns, data=data)
            # a media file of the run (relative to it), not an artifact that names a staging copy by absolute path
            table.bind_to_run(run, f"tables/{title}", step)
            run.log({f"tables/{title}": table})
        for path in figures:
            run.log({f"figures/{path.stem}": wandb.Image(str(path))})
    except (Exception, SystemExit) as e:  # noqa: BLE001 - raised again below, once the run is finished as failed
        failed = e
    try:
        _finish(run, finished, exit_code=1 if failed else 0)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the tracker's warning names the run left unfinished
        failed = failed or e
        failed.unfinished = [_label(run)]
    if failed is not None:
        raise failed
