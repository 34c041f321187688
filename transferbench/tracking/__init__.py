"""Experiment trackers a run logs to (`--log-to tensorboard,wandb`): TensorBoard event files and Weights & Biases
runs, offline first. Each cell is one entry (a TensorBoard run folder, a W&B run) named by its task, dataset,
backbone, stage, swept hyper-parameters and seed: its training curve (the loss and learning rate of every step,
sent as the training loop reads them), its final metrics per split, its wall time and its settings with their
sources. At the end of a run the report's tables and the leaderboard's figures go to one entry more per task
(`tracking.runs`).

The tracker options are execution options: they enter no cell key, and logging never changes a number (the loop
reads the losses at the host reads it makes anyway; each tracker call keeps the random generators' states).
A tracker that fails (a full disk, a broken install) costs one warning and is off for the rest of that process;
the cells go on. A worker process (`--jobs`, Ray) logs its own cells, each into an entry of its own.

This package is no part of any computation's fingerprint (`fingerprint.NOT_COMPUTING`): it reads what the
training loop and the cell's outcome hold and writes it elsewhere."""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError, close_matches
from .entries import (
    DEFAULT_DIR,
    DEFAULT_PROJECT,
    INSTALL,
    KINDS,
    TRAIN,
    WANDB_MODES,
    Tracking,
    entry_parts,
    settings_table,
)

log = logging.getLogger("transferbench")


def check(tracking: Tracking | None, out: Path | None = None) -> None:
    """Everything a run's tracking needs, checked before any cell: the trackers import, the mode is known, the
    folder takes a write and lies outside the records folder `out`; else one UserError naming the fix."""
    if tracking is None or not tracking.kinds:
        return
    for kind in tracking.kinds:
        if kind not in KINDS:
            raise UserError(
                f"--log-to {kind!r} is not a tracker; choose from {', '.join(KINDS)} (comma-separated)"
                f"{close_matches(kind, KINDS)}"
            )
        try:
            module = _import(kind)
        except Exception as e:  # noqa: BLE001 - a missing or broken install says the same: install the extra
            raise UserError(
                f"--log-to {kind} needs the {kind} package, which does not import here ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}): {INSTALL}"
            ) from None
        if kind == "wandb":
            from .wandb import MINIMUM

            have = tuple(int(n) for n in re.findall(r"\d+", module.__version__)[:3])
            if have < MINIMUM:
                raise UserError(
                    f"--log-to wandb needs wandb {'.'.join(map(str, MINIMUM))} or newer (one run per cell), and "
                    f"{module.__version__} is installed: {INSTALL} --upgrade"
                )
    if "wandb" in tracking.kinds and tracking.wandb_mode() not in WANDB_MODES:
        raise UserError(
            f"W&B mode {tracking.wandb_mode()!r} (--wandb-mode or WANDB_MODE) is not one of {', '.join(WANDB_MODES)}"
        )
    where = Path(tracking.dir).expanduser().resolve()
    if out is not None and where.is_relative_to(Path(out).expanduser().resolve()):
        raise UserError(
            f"--log-dir {tracking.dir} lies inside the records folder {out} (whose .json files are read as records); "
            "give a folder beside it, e.g. --log-dir tracking"
        )
    from ..paths.writes import probe

    try:
        probe(where)
    except OSError as e:
        raise UserError(
            f"--log-dir {tracking.dir}: cannot write there ({(e.strerror or str(e)).lower()}); give a writable folder"
        ) from None


def _import(kind: str):
    if kind == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter
    import wandb

    return wandb


# --- guarded calls ----------------------------------------------------------------------------------------------

_OFF: set = set()  # trackers that failed in this process: off for its remaining cells


def guarded(kind: str, what: str, call: Callable, *args, **kwargs):
    """`call(*args, **kwargs)` for tracker `kind`, with the random generators' states (Python's, numpy's, torch's
    CPU one) as they were before it; a failure is one warning and turns the tracker off in this process. Returns
    the call's result, or None where it failed or the tracker is off."""
    if kind in _OFF:
        return None
    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        return call(*args, **kwargs)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a tracker never costs a cell (an interrupt goes through)
        _OFF.add(kind)
        log.warning(
            "transferbench: warning: --log-to %s failed while %s (%s: %s); it is off in this process for the rest "
            "of the run, and the cells go on",
            kind,
            what,
            type(e).__name__,
            str(e).splitlines()[0] if str(e) else "",
        )
        return None
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _quietly(call: Callable) -> None:
    try:
        call()
    except (Exception, SystemExit):  # noqa: BLE001, S110 - the tracker has had its warning already
        pass


# --- a cell's entry ---------------------------------------------------------------------------------------------


@dataclass
class CellLog:
    """One cell's entry in each tracker of a run (`cell_entry`); the training loop sends its curves through
    `curve`, and `close` writes the outcome."""

    tracking: Tracking
    cell: object
    sinks: dict = field(default_factory=dict)  # kind -> its sink (tracking.tensorboard / tracking.wandb)
    loops: dict = field(default_factory=dict)  # a training loop's desc -> its tag
    closed: bool = False

    def curve(self, desc: str):
        """The Curve of the training loop named `desc` (its tag: curve, then curve_2, ...)."""
        if desc not in self.loops:
            self.loops[desc] = TRAIN if not self.loops else f"{TRAIN}_{len(self.loops) + 1}"
        return Curve(self, self.loops[desc])

    def close(self, outcome: dict) -> None:
        """The outcome into each entry, which is then finished; a tracker that failed earlier lets its go."""
        self.closed = True
        for kind, sink in self.sinks.items():
            if kind in _OFF:
                _quietly(sink.abandon)
            else:
                guarded(kind, "closing a cell's entry", sink.close, outcome, dict(self.loops))

    def abandon(self) -> None:
        """Each entry finished as it is (the cell ended without an outcome: interrupted, its worker stopping)."""
        self.closed = True
        for sink in self.sinks.values():
            _quietly(sink.abandon)


class Curve:
    """One training loop's curve: `send` logs the steps the loop has not yet sent (their losses, read from the
    device in one go, and the learning rate of each)."""

    def __init__(self, cell_log: CellLog, tag: str):
        self.log, self.tag, self.sent = cell_log, tag, 0

    def send(self, losses: list, lr_of: Callable[[int], float]) -> None:
        """`losses`: the loop's per-step loss tensors so far; `lr_of(step)`: the schedule's rate at step (from 0)."""
        if len(losses) <= self.sent:
            return
        import torch

        values = torch.stack(losses[self.sent :]).float().cpu().tolist()
        steps = range(self.sent + 1, len(losses) + 1)
        lrs = [float(lr_of(s - 1)) for s in steps]
        self.sent = len(losses)
        for kind, sink in self.log.sinks.items():
            guarded(kind, "logging a training curve", sink.curve, self.tag, list(steps), values, lrs)


_CURRENT: CellLog | None = None


def current() -> CellLog | None:
    """The entry of the cell this process computes, where the run logs to a tracker; else None."""
    return _CURRENT


@contextmanager
def cell_entry(tracking: Tracking | None, cell, settings_model=None):
    """The cell's entry in each of the run's trackers while it computes (`current()` inside); yields the CellLog,
    or None where the run logs nowhere. The caller closes it with the outcome; an entry left open (an interrupt, an
    error outside the cell's own) is finished as it is on the way out."""
    global _CURRENT
    if tracking is None or not tracking.kinds:
        yield None
        return
    entry = CellLog(tracking, cell)
    settings = settings_table(cell, settings_model)
    for kind in tracking.kinds:
        sink = guarded(kind, "opening a cell's entry", _open, kind, tracking, cell, settings)
        if sink is not None:
            entry.sinks[kind] = sink
    _CURRENT = entry
    try:
        yield entry
    finally:
        _CURRENT = None
        if not entry.closed:
            entry.abandon()


def _open(kind: str, tracking: Tracking, cell, settings: list[tuple]):
    if kind == "tensorboard":
        from .tensorboard import CellBoard

        return CellBoard(tracking, cell, settings)
    from .wandb import CellRun

    return CellRun(tracking, cell, settings)


__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_PROJECT",
    "KINDS",
    "WANDB_MODES",
    "CellLog",
    "Curve",
    "Tracking",
    "cell_entry",
    "check",
    "current",
    "entry_parts",
    "guarded",
]
