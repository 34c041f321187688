"""Experiment trackers a run logs to (`--log-to tensorboard,wandb`): TensorBoard event files and Weights & Biases
runs, offline first. Each cell is one entry (a TensorBoard run folder, a W&B run) named by its task, dataset,
backbone, stage, swept hyper-parameters and seed: its training curve (the loss and learning rate of every step,
sent as the training loop reads them), its final metrics per split, its wall time and its settings with their
sources. At the end of a run the report's tables and the leaderboard's figures go to one entry more per task,
which the front logs (`cli.tracked`: tracking draws no report).

The tracker options are execution options: they enter no cell key, and logging never changes a number (the loop
reads the losses at the host reads it makes anyway; each tracker call keeps the random generators' states).
A tracker that fails (a full disk, a broken install) costs one warning and is off for the rest of that process;
the cells go on. A worker process (`--jobs`, Ray) logs its own cells, each into an entry of its own. What a process
knows of its trackers is one object, `Trackers`, handed in: the cell's context carries it and the cell's entry
(engine.compute), and the training loop gets the entry from there (engine.train.fit's `log`); this package keeps no
state of its own.

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
    wandb_name,
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
    for kind in tracking.kinds:
        _check_install(kind, where)


def _check_install(kind: str, where: Path) -> None:
    try:
        module = _import(kind, where)
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


def _import(kind: str, folder: Path):
    if kind == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter
    from .wandb import import_wandb

    return import_wandb(folder)


# --- a process's trackers ---------------------------------------------------------------------------------------


class Trackers:
    """The run's trackers in one process: those that failed (each off for the process's remaining cells, after one
    warning), the W&B runs it finished (named where a full disk lost one) and the cell entry open now (a failure
    while it is open is warned of once it is finished). The front makes one per command and hands it to the cells it
    computes itself and to the end-of-run report (`cli.tracked`); a pool worker makes its own (engine.executors), and
    a Ray task or a cell computed alone gets a fresh one (engine.compute). Pickled, it travels as a fresh one: what
    failed in one process is that process's."""

    def __init__(self) -> None:
        self.off: set = set()
        self.finished: list = []  # (name, folder) of each W&B run this process finished, oldest first
        self.open: CellLog | None = None

    def __reduce__(self):
        return (Trackers, ())

    def guarded(self, kind: str, what: str, call: Callable, *args, **kwargs):
        """`call(*args, **kwargs)` for tracker `kind`, with the random generators' states (Python's, numpy's, torch's
        CPU one) as they were before it; a failure (the call's, or W&B's own log that it could not write) turns the
        tracker off in this process and costs one warning (`fail`). Returns the call's result, or None where it
        failed or the tracker is off."""
        result, error, what = self.attempt(kind, what, call, *args, **kwargs)
        if error is None:
            return result
        self.fail(kind, what, error)
        return None

    def attempt(self, kind: str, what: str, call: Callable, *args, **kwargs):
        """(result, error or None, what failed) of `call` for tracker `kind`, the random generators' states kept; a
        call that returned although W&B's own log could not be written returns its result and that error."""
        if kind in self.off:
            return None, None, what
        import numpy as np
        import torch

        states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        logged = _own_log_failures(kind)
        try:
            result = call(*args, **kwargs)
            failures = _own_log_failures(kind)[len(logged) :]
            if not failures:
                return result, None, what
            error = failures[-1][1] or OSError(f"cannot write {failures[-1][0]}")
            return result, error, f"{what}, writing its own log"
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a tracker never costs a cell (an interrupt goes through)
            return None, e, what
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])

    def fail(self, kind: str, what: str, error: BaseException) -> None:
        """The tracker off in this process, and its one warning: now, or, where a cell's entry in it is open, once the
        entry has been finished, so that the warning can name a run that could not be finished."""
        self.off.add(kind)
        text = (
            f"--log-to {kind} failed while {what} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''})"
        )
        if self.open is not None and not self.open.closed:
            self.open.failures.setdefault(kind, text)
        else:
            self.warn(kind, text, getattr(error, "unfinished", ()))  # a report's run that could not be finished

    def warn(self, kind: str, text: str, unfinished: list | tuple = ()) -> None:
        """The tracker's one warning line: what failed, and each entry left unfinished (the one that could not be
        finished, and for W&B the runs its inspector does not read as ended)."""
        if kind == "wandb":
            from .wandb import unfinished as lost

            unfinished = list(dict.fromkeys([*unfinished, *lost(self.finished)]))
        left = (
            f"; not finished (they read as still running): {', '.join(unfinished)}"
            if len(unfinished) > 1
            else f"; entry {unfinished[0]} could not be finished (it reads as still running)"
            if unfinished
            else ""
        )
        log.warning(
            "transferbench: warning: %s; it is off in this process for the rest of the run, and the cells go on%s",
            text,
            left,
        )

    @contextmanager
    def cell_entry(self, tracking: Tracking | None, cell, settings_model=None):
        """The cell's entry in each of the run's trackers while it computes; yields the CellLog (which the cell's
        context carries to its training loops: engine.compute), or None where the run logs nowhere. The caller
        closes it with the outcome; an entry left open (an interrupt, an error outside the cell's own) is finished as
        it is on the way out."""
        if tracking is None or not tracking.kinds:
            yield None
            return
        entry = CellLog(tracking, cell, self)
        settings = settings_table(cell, settings_model)
        self.open = entry  # a failure from here on is warned of once the entry is finished (CellLog._end)
        try:
            for kind in tracking.kinds:
                args = (kind, tracking, cell, settings, self.finished)
                sink, error, what = self.attempt(kind, "opening a cell's entry", _open, *args)
                if sink is not None:  # opened, even where W&B's own log failed: it is finished with the entry
                    entry.sinks[kind] = sink
                if error is not None:
                    self.fail(kind, what, error)
            yield entry
        finally:
            self.open = None
            if not entry.closed:
                entry.abandon()


def _own_log_failures(kind: str) -> list:
    if kind != "wandb":
        return []
    from .wandb import log_failures

    return list(log_failures())


def _ended(sink) -> str | None:
    """`sink` finished, as failed where it was not yet (a finished one is left as it is); its name where even that
    fails."""
    try:
        sink.abandon()
        return None
    except (Exception, SystemExit):  # noqa: BLE001 - named in the tracker's one warning
        return getattr(sink, "name", None) or "?"


# --- a cell's entry ---------------------------------------------------------------------------------------------


@dataclass
class CellLog:
    """One cell's entry in each tracker of a run (`Trackers.cell_entry`); the training loop sends its curves through
    `curve`, and `close` writes the outcome."""

    tracking: Tracking
    cell: object
    trackers: Trackers = field(default_factory=Trackers)  # the process's trackers, whose failures it shares
    sinks: dict = field(default_factory=dict)  # kind -> its sink (tracking.tensorboard / tracking.wandb)
    loops: dict = field(default_factory=dict)  # a training loop's desc -> its tag
    failures: dict = field(default_factory=dict)  # kind -> its warning, given once the entry has been finished
    closed: bool = False

    def curve(self, desc: str):
        """The Curve of the training loop named `desc` (its tag: curve, then curve_2, ...)."""
        if desc not in self.loops:
            self.loops[desc] = TRAIN if not self.loops else f"{TRAIN}_{len(self.loops) + 1}"
        return Curve(self, self.loops[desc])

    def close(self, outcome: dict) -> None:
        """The outcome into each entry, which is then finished; a tracker that failed lets its entry go, finished as
        failed."""
        for kind, sink in self.sinks.items():
            if kind not in self.trackers.off:
                self.trackers.guarded(kind, "closing a cell's entry", sink.close, outcome, dict(self.loops))
        self.closed = True
        for kind in {**self.sinks, **self.failures}:
            self._end(kind, self.sinks.get(kind))

    def abandon(self) -> None:
        """Each entry finished as it is (the cell ended without an outcome: interrupted, its worker stopping)."""
        self.closed = True
        for kind in {**self.sinks, **self.failures}:
            self._end(kind, self.sinks.get(kind), always=True)

    def _end(self, kind: str, sink, always: bool = False) -> None:
        """Where `kind` failed (now or before), or `always`, its entry finished as failed, and the tracker's one warning
        given where it failed, naming the entry if even that failed."""
        if not always and kind not in self.trackers.off and kind not in self.failures:
            return
        unfinished = _ended(sink) if sink is not None else None
        if unfinished:  # a tracker that fails only here (an interrupted cell's entry) has failed all the same
            self.trackers.off.add(kind)
            self.failures.setdefault(kind, f"--log-to {kind} failed while finishing an interrupted cell's entry")
        if kind in self.failures:
            self.trackers.warn(kind, self.failures.pop(kind), [unfinished] if unfinished else [])


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
            self.log.trackers.guarded(kind, "logging a training curve", sink.curve, self.tag, list(steps), values, lrs)


def _open(kind: str, tracking: Tracking, cell, settings: list[tuple], finished: list):
    if kind == "tensorboard":
        from .tensorboard import CellBoard

        return CellBoard(tracking, cell, settings)
    from .wandb import CellRun

    return CellRun(tracking, cell, settings, finished)


__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_PROJECT",
    "KINDS",
    "WANDB_MODES",
    "CellLog",
    "Curve",
    "Tracking",
    "Trackers",
    "check",
    "entry_parts",
    "wandb_name",
    "where",
]


def where(tracking: Tracking, kinds=None) -> str:
    """Where a run's entries are (those of `kinds`, default all), and the command that shows them."""
    said = []
    for kind in kinds or tracking.kinds:
        if kind == "tensorboard":
            said.append(f"TensorBoard (tensorboard --logdir {tracking.dir})")
        else:
            mode = tracking.wandb_mode()
            after = f"; upload: wandb sync {tracking.dir}/wandb/offline-run-*" if mode == "offline" else ""
            said.append(f"W&B, {mode}, project {tracking.project}{after}")
    return " and ".join(said)
