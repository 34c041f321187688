"""What a run's tracker entries are: the options (`Tracking`), an entry's name (`entry_parts`), a cell's final
metrics as its record holds them and its settings with their sources; shared by the trackers' modules."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

KINDS = ("tensorboard", "wandb")
WANDB_MODES = ("offline", "online", "disabled")
INSTALL = "pip install 'transferbench[tracking]'"
DEFAULT_DIR = Path("tracking")
DEFAULT_PROJECT = "transferbench"
TRAIN = "train"  # the tag of a cell's first training loop; a later loop of the same cell is train_2, train_3, ...


@dataclass(frozen=True)
class Tracking:
    """Where a run logs: the trackers (`kinds`, of KINDS), the folder (TensorBoard's log dir; W&B's `dir`, under
    which it writes wandb/offline-run-*), and W&B's project, entity, group (None: TASK/SUITE) and mode (None: the
    WANDB_MODE variable, else offline)."""

    kinds: tuple = ()
    dir: Path = DEFAULT_DIR
    project: str = DEFAULT_PROJECT
    entity: str | None = None
    group: str | None = None
    mode: str | None = None

    def wandb_mode(self) -> str:
        return self.mode or os.environ.get("WANDB_MODE") or "offline"

    def group_of(self, task: str, suite: str) -> str:
        return self.group or f"{task}/{suite or 'all'}"


def _part(text) -> str:
    """A name part that is one folder: no separators or spaces."""
    return re.sub(r"[/\\\s]+", "_", str(text)) or "_"


def entry_parts(cell) -> list[str]:
    """A cell's entry name, part by part: task, suite, dataset, backbone, stage, the hyper-parameters its stage
    sweeps (`cell.select`, as NAME=VALUE) and the seed."""
    swept = ",".join(f"{k}={cell.hparams[k]}" for k in cell.select if k in cell.hparams)
    parts = [cell.task, cell.suite or "all", cell.dataset, cell.backbone, cell.stage or "cell"]
    return [_part(p) for p in parts] + ([_part(swept)] if swept else []) + [f"seed{cell.seed}"]


def final_metrics(outcome: dict) -> dict:
    """SPLIT/METRIC -> the value as the cell's record holds it (`records.store.tidy`)."""
    from ..records.store import tidy

    return {f"{split}/{m}": tidy(v) for split, values in outcome.get("metrics", {}).items() for m, v in values.items()}


def settings_table(cell, settings_model) -> list[tuple[str, object, str]]:
    """(name, value, source) of each setting the cell ran: its hyper-parameters, then its execution settings."""
    fields = getattr(settings_model, "model_fields", {}) if settings_model is not None else {}

    def source(name: str) -> str:
        f = fields.get(name)
        extra = (f.json_schema_extra or {}) if f is not None else {}
        return extra.get("source", "") if isinstance(extra, dict) else ""

    values = {**cell.hparams, **(cell.execution or {})}
    return [(k, v, source(k)) for k, v in values.items()]
