"""Weights & Biases: each cell a run, offline unless asked otherwise (`wandb sync LOG_DIR/wandb/offline-run-*`
uploads later), named TASK/SUITE/DATASET/BACKBONE/STAGE[/SWEPT]/seedN-KEY in the group TASK/SUITE (so a sweep's cells
compare in one view), job type the cell's stage. Config: the cell's identity, its settings and their sources.
History: TAG/loss and TAG/lr against TAG/step (TAG: curve, curve_2, ... one per training loop). Summary: SPLIT/METRIC,
wall_s, status (a cell that did not finish ok is a failed W&B run). No console capture, no system metrics and, offline,
no error reports: the run holds what the cell did."""

from __future__ import annotations

from pathlib import Path

from .entries import Tracking, entry_parts, final_metrics, plain


def _settings(wandb):
    return wandb.Settings(
        console="off", x_disable_stats=True, silent=True, disable_git=True, save_code=False, x_save_requirements=False
    )


MINIMUM = (0, 19, 10)  # wandb.init(reinit="create_new"): one run per cell in a long-lived worker


def _finish(run, exit_code: int = 0) -> None:
    """Finish `run` and return once its file is whole. W&B's service process writes a run's file after `finish`
    returns; shutting the service down waits for it. So an entry is complete on disk when its cell's record is
    written, in the driver, in a pool worker (which ends through os._exit, where W&B's own exit hook never runs) and
    in a Ray worker (which may be stopped once the run ends). The next run starts the service again (0.2 s). A W&B
    run the caller holds open in this process keeps the service up; W&B completes the files when it ends."""
    import wandb

    run.finish(exit_code=exit_code)
    if wandb.setup().most_recent_active_run is None:
        wandb.teardown()


def _init(tracking: Tracking, **kwargs):
    import os

    import wandb

    if tracking.wandb_mode() == "offline":  # offline means nothing leaves: W&B's own error reports neither
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    folder = Path(tracking.dir)
    folder.mkdir(parents=True, exist_ok=True)
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

    def __init__(self, tracking: Tracking, cell, settings: list[tuple]):
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
            name="/".join(entry_parts(cell, tracking.swept)),
            group=tracking.group_of(cell.task, cell.suite),
            job_type=cell.stage or "cell",
            config={
                "cell": identity,
                "settings": {k: v for k, v, _ in settings},
                "sources": {k: s for k, _, s in settings},
            },
        )
        self.tags: set = set()

    def curve(self, tag: str, steps: list, losses: list, lrs: list) -> None:
        if tag not in self.tags:
            self.run.define_metric(f"{tag}/step")
            self.run.define_metric(f"{tag}/*", step_metric=f"{tag}/step")
            self.tags.add(tag)
        for step, loss, lr in zip(steps, losses, lrs):
            self.run.log({f"{tag}/step": step, f"{tag}/loss": loss, f"{tag}/lr": lr})

    def abandon(self) -> None:
        _finish(self.run, exit_code=1)  # W&B marks it failed

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
        _finish(self.run, exit_code=0 if outcome.get("status") == "ok" else 1)


def report(tracking: Tracking, task: str, suite: str, tables: list[tuple[str, list[dict]]], figures: list[Path]):
    """The run's report of `task`: one run (job type report) in the task's group, each table a wandb.Table of its
    rows, each figure a wandb.Image."""
    import wandb

    name, group = f"{task}/{suite or 'all'}/report", tracking.group_of(task, suite)
    run = _init(tracking, name=name, group=group, job_type="report")
    try:
        for title, rows in tables:
            columns = list(dict.fromkeys(k for row in rows for k in row))
            data = [[plain(row.get(c)) for c in columns] for row in rows]
            run.log({f"tables/{title}": wandb.Table(columns=columns, data=data)})
        for path in figures:
            run.log({f"figures/{path.stem}": wandb.Image(str(path))})
    finally:
        _finish(run)
