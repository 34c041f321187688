"""What a run's tracker entries are: the options (`Tracking`), an entry's name (`entry_parts`), a cell's final
metrics as its record holds them and its settings with their sources; shared by the trackers' modules."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

KINDS = ("tensorboard", "wandb")
WANDB_MODES = ("offline", "online", "disabled")
INSTALL = "pip install 'transferbench[tracking]'"
DEFAULT_DIR = Path("tracking")
DEFAULT_PROJECT = "transferbench"
# the tag of a cell's first training loop (curve/loss, curve/lr); a later loop of the same cell is curve_2, curve_3, ...
# (not train: a record's metrics may have a split of that name, train/loss_heldout)
TRAIN = "curve"


@dataclass(frozen=True)
class Tracking:
    """Where a run logs: the trackers (`kinds`, of KINDS), the folder (TensorBoard's log dir; W&B's `dir`, under
    which it writes wandb/offline-run-*), and W&B's project, entity, group (None: TASK/SUITE) and mode (None: the
    WANDB_MODE variable, else offline). The command line resolves the folder and the mode in the driver
    (`resolved`), so that a worker on another node logs where and how the driver was told.
    `swept`: the hyper-parameters the task sweeps (engine.runner sets it per task), named in each entry."""

    kinds: tuple = ()
    dir: Path = DEFAULT_DIR
    project: str = DEFAULT_PROJECT
    entity: str | None = None
    group: str | None = None
    mode: str | None = None
    swept: tuple = ()

    def wandb_mode(self) -> str:
        return self.mode or os.environ.get("WANDB_MODE") or "offline"

    def resolved(self) -> Tracking:
        """These options with the folder made absolute and the mode decided here (the driver), so that every worker,
        on any node, logs where and how the driver was told."""
        return replace(self, dir=Path(self.dir).expanduser().absolute(), mode=self.wandb_mode())

    def group_of(self, task: str, suite: str) -> str:
        return self.group or f"{task}/{suite or 'all'}"


def _part(text) -> str:
    """A name part that is one folder: no separators or spaces."""
    return re.sub(r"[/\\\s]+", "_", str(text)) or "_"


def entry_parts(cell, swept=()) -> list[str]:
    """A cell's entry, part by part: task, suite, backbone, then one part that reads as words: the dataset, the stage,
    the hyper-parameters the task sweeps (`swept`: the learning rates a stage selects from, few-shot's shots,
    ADE20K's fraction; as NAME=VALUE) and the seed. TensorBoard's run list shows a long name's start and end: the
    backbone and the swept settings with the seed stay readable there (the HParams dashboard has every part as a
    column). Two cells that differ in anything else (a --set of another run into the same folder) are told apart by
    their keys (`fresh_folder`, `wandb_name`)."""
    keys = [k for k in (*swept, *cell.select) if k in cell.hparams]
    named = [f"{k}={cell.hparams[k]}" for k in dict.fromkeys(keys)]
    leaf = " ".join([_part(cell.dataset), _part(cell.stage or "cell"), *map(_part, named), f"seed{cell.seed}"])
    return [_part(p) for p in (cell.task, cell.suite or "all", cell.backbone)] + [leaf]


def wandb_name(cell, swept=()) -> str:
    """A cell's W&B run name: its entry's parts and the first 8 characters of its key (W&B keeps no folders to tell
    two cells of one name apart)."""
    return "/".join(entry_parts(cell, swept)) + f" {cell.key[:8]}"


def fresh_folder(folder: Path, key: str = "") -> Path:
    """`folder`, made and taken for the cell of `key`; where an earlier attempt of the same cell took it, the first
    free `rerun-N` below it; where another cell took it (the same name, another key), `folder KEY8` beside it. Taking
    is atomic (making `.taken`, which keeps the key), so no two writers share a folder."""
    if key:
        taken = folder / ".taken" / "key"
        if taken.is_file() and taken.read_text() != key:
            folder = folder.with_name(f"{folder.name} {key[:8]}")
    n, chosen = 1, folder
    while True:
        chosen.mkdir(parents=True, exist_ok=True)
        try:
            (chosen / ".taken").mkdir()
            if key:
                (chosen / ".taken" / "key").write_text(key)
            return chosen
        except FileExistsError:
            n += 1
            chosen = folder / f"rerun-{n}"


def plain(value):
    """A value as a tracker's table or HParams session takes it: a bool, number, string (or None) as it is, anything
    else (a list, a mapping) as its text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def final_metrics(outcome: dict) -> dict:
    """SPLIT/METRIC -> the value as the cell's record holds it (`records.store.tidy`)."""
    from ..records.store import tidy

    return {f"{split}/{m}": tidy(v) for split, values in outcome.get("metrics", {}).items() for m, v in values.items()}


def settings_table(cell, settings_model) -> list[tuple[str, object, str]]:
    """(name, value, source) of each setting the cell ran: its hyper-parameters, then its execution settings. The
    source is where the value that ran came from (the cell's `sources`: a suite, --set, a rule, the weights), and the
    protocol default's own source (a paper's config) only where the value is that default."""
    default = getattr(settings_model, "source_of", lambda name: "")  # a settings.Settings model, or None
    values = {**cell.hparams, **(cell.execution or {})}
    sources = getattr(cell, "sources", None) or {}
    return [(k, v, sources.get(k) or default(k)) for k, v in values.items()]
