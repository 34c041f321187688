"""Run a task's plan: in-process and sequential by default, resumable, safe against kill -9 and
against a second run writing into the same folder."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import uuid
from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from datetime import datetime

from tqdm.auto import tqdm

from ..cell import DEFAULT_PIXELS
from ..errors import UserError
from ..fingerprint import STALE, differences
from ..paths.ledger import Ledger
from ..records.aggregate import select_best
from ..records.store import FINISHED, RecordStore, Timeout, record_of
from .compute import CellContext, cell_code, lost_outcome

__all__ = ["Results", "RunOptions", "RunSummary", "headline", "run_task"]

log = logging.getLogger("transferbench")


class Results:
    """Planning's view of the records: adapters ask it which setting won a finished first stage. With `current`
    (record, cell) -> bool, a record of other code counts as unfinished (it is being computed again)."""

    def __init__(self, store: RecordStore, current=None):
        self.store, self.current = store, current

    def best(self, cells: list) -> dict | None:
        """The winning `select` setting among `cells` once all of them are finished, else None."""
        if not cells:
            return None
        recs = [self.store.get(c) for c in cells]
        if any(r is None or r["status"] not in FINISHED for r in recs):
            return None
        if self.current is not None and not all(self.current(r, c) for r, c in zip(recs, cells, strict=True)):
            return None
        return select_best(recs, cells[0].select, cells[0].mode)


class CodeCheck:
    """Whether a finished record was computed by the code at hand: its fingerprint against `cell_code` of the cell's
    adapter and backbone, computed once per backbone in this run."""

    def __init__(self, adapter):
        self.adapter, self._code = adapter, {}

    def code(self, cell) -> dict:
        if cell.backbone not in self._code:
            self._code[cell.backbone] = cell_code(self.adapter, cell.backbone).record()
        return self._code[cell.backbone]

    def current(self, record: dict, cell) -> bool:
        return (record.get("fingerprint") or {}).get("digest") == self.code(cell)["digest"]

    def message(self, task: str, out, stale: list, finished: int) -> str:
        """The one line that stops a run over `stale` finished cells ((record, cell) pairs) of other code."""
        why: dict[str, int] = {}
        for record, cell in stale:
            for d in differences(record.get("fingerprint"), self.code(cell)):
                why[d] = why.get(d, 0) + 1
        ranked = sorted(why, key=lambda d: (-why[d], d))
        what = "; ".join(ranked[:4]) + (f"; and {len(ranked) - 4} more" if len(ranked) > 4 else "")
        return (
            f"{task}: {len(stale)} of {finished} finished cells in {out} were computed by other code ({what}): rerun "
            "with --stale recompute to compute them again, or with --stale keep to keep them (reports then name both "
            "fingerprints); nothing was computed"
        )


@dataclass
class RunSummary:
    run_id: str
    ok: int = 0
    diverged: int = 0
    failed: int = 0
    skipped: int = 0
    stale: int = 0  # finished cells of other code: computed again (--stale recompute) or kept (--stale keep)
    stale_policy: str = "stop"
    failures: list = field(default_factory=list)
    caches: dict = field(default_factory=dict)  # cache folder -> {'read': n, 'computed': m}, over computed cells

    def add_caches(self, counts: dict) -> None:
        for kind, c in (counts or {}).items():
            mine = self.caches.setdefault(kind, {"read": 0, "computed": 0})
            for what in ("read", "computed"):
                mine[what] += int(c.get(what, 0))

    def line(self) -> str:
        stale = ""
        if self.stale:
            stale = f", {self.stale} of other code {'kept' if self.stale_policy == 'keep' else 'computed again'}"
        caches = "; ".join(
            f"{kind} {c['computed']} computed, {c['read']} read" for kind, c in sorted(self.caches.items())
        )
        return (
            f"{self.ok} ok, {self.diverged} diverged, {self.failed} failed, {self.skipped} skipped (already finished)"
            f"{stale}; cache entries: {caches or 'none used'}"
        )


@dataclass(kw_only=True)
class RunOptions(CellContext):
    """How a task's cells run: the one options object from the command line (`cli.options.run_options`) to the
    runner, each cell's context (the fields of `CellContext` it extends) and the records' `config`. None of them
    is part of a cell key. It checks its values when made: a bad one is one line (UserError)."""

    force: bool = False
    stale: str | None = None  # None: stop on records of other code (fingerprint.STALE: stop | recompute | keep)
    retries: int = 1
    executor_name: str = "local"
    jobs: int = 1
    config: dict = field(default_factory=dict)  # the resolved options, stored in each record

    def __post_init__(self) -> None:
        checks = (
            (self.workers >= 0, f"--workers must be >= 0, got {self.workers}"),
            (self.micro_batch is None or self.micro_batch >= 1, f"--micro-batch must be >= 1, got {self.micro_batch}"),
            (self.retries >= 0, f"--retries must be >= 0, got {self.retries}"),
            (self.stale in (None, *STALE), f"--stale {self.stale!r} is not one of {', '.join(STALE)}"),
        )
        for ok, problem in checks:
            if not ok:
                raise UserError(problem)

    def context(self) -> CellContext:
        """What each cell's `run` gets of these options: the fields of CellContext."""
        return CellContext(**{f.name: getattr(self, f.name) for f in dataclasses.fields(CellContext)})


def run_task(
    task, backbones: list, out, options: RunOptions | None = None, *, adapter=None, executor=None
) -> RunSummary:
    """Plan and run every cell of `task` for `backbones` into the records folder `out` under `options` (default:
    RunOptions()), with `adapter` (default: the one the task was resolved with, `task.adapter`; the engine never
    looks adapters up). The data is the caller's to check first (`workflows.run` does, before any pretraining).

    `executor` (engine.executors; default: this process, one cell at a time) computes the cells; this
    function alone plans, locks and writes records. The plan is asked again whenever cells finish, so a
    second stage (VTAB's final cells) starts as soon as its first stage is done while other datasets still
    run. A cell whose worker process died (engine.futures.WorkerLost) is submitted again up to `retries`
    times, then recorded failed.

    A finished cell is skipped only when its record's fingerprint is the code's at hand (`cell_code`); for finished
    cells of other code, `options.stale` (STALE) says what happens: 'stop' (the default) raises one UserError before
    anything is computed (naming how many and what differs), 'recompute' computes them again, 'keep' skips them as
    finished. `options.pins`: per cell key, the precision of each `bf16: auto` step (the nightly pins them to its
    baseline's)."""
    from .executors import InlineExecutor

    options = options or RunOptions()
    stale = options.stale or "stop"

    adapter = adapter or task.adapter
    if adapter is None:
        raise TypeError(
            "run_task needs the task's adapter: resolve the task with transferbench.adapters.prepare_task "
            "or pass adapter="
        )
    store = RecordStore(out)
    store.remove_stale_temps()
    executor = executor or InlineExecutor()
    ctx = options.context()
    if ctx.tracking is not None:  # each entry names the settings this task sweeps (tracking.entries.entry_parts)
        ctx = dataclasses.replace(ctx, tracking=dataclasses.replace(ctx.tracking, swept=tuple(sorted(task.sweep))))
    if task.hparams.get("pixels") == "auto":
        for b in backbones:
            if b.checkpoint and not b.pixels:  # said once per run and backbone
                log.warning(
                    "%s: the checkpoint states no pixel normalisation; using %r (pixels in [-1, 1]); set "
                    "another with --set pixels=imagenet|inception|mean=R,G,B/std=R,G,B",
                    b.spec,
                    DEFAULT_PIXELS,
                )
    return _TaskRun(task, backbones, out, adapter, store, executor, options, stale).run(ctx)


class _TaskRun:
    """The state of one run_task: the cells planned so far, the queue, the cells another run holds, those in
    flight, and the progress bar and lines; `run` loops until nothing is left."""

    def __init__(self, task, backbones, out, adapter, store, executor, options: RunOptions, stale: str):
        self.task, self.backbones, self.out, self.adapter = task, backbones, out, adapter
        self.store, self.executor = store, executor
        self.stale, self.force, self.retries, self.config = stale, options.force, options.retries, options.config
        show_progress = options.show_progress
        self.check = CodeCheck(adapter)  # whether a finished cell's record is of the code at hand
        self.results = Results(store, None if stale == "keep" else self.check.current)
        self.summary = RunSummary(uuid.uuid4().hex[:12], stale_policy=stale)
        self.ledger = Ledger()  # the cache entries that the cells computed in this process meet (paths.ledger)
        self.attempted: set[str] = set()  # planned in this run: computed, skipped, or queued (failed ones wait)
        self.queue: deque = deque()  # cells to compute: plan order, newly unlocked ones first
        self.held: dict[str, object] = {}  # cells whose lock another run holds: computed or skipped once it lets go
        self.inflight: dict = {}  # future -> (cell, lock, attempt)
        self.changed = True  # a cell finished (here or in another run): the plan may have grown
        self.bar = tqdm(
            total=0,
            desc=f"{task.name} cells",
            unit="cell",
            position=0,
            dynamic_ncols=True,
            disable=None if show_progress else True,
        )
        self.lines = CellLines(task.name, show_progress, axes=sorted(task.sweep))

    def show(self):
        held = f", waiting on another run {len(self.held)}" if self.held else ""
        self.bar.set_postfix_str(f"running {len(self.inflight)}, failed {self.summary.failed}{held}", refresh=True)

    def is_done(self, cell) -> bool:
        """Finished, by the code at hand unless stale cells are kept."""
        return self.store.finished(cell) and (self.stale == "keep" or self.check.current(self.store.get(cell), cell))

    def replan(self):
        store, summary = self.store, self.summary
        planned = list(
            {c.key: c for b in self.backbones for c in self.adapter.plan(self.task, b, self.results)}.values()
        )
        first = not self.attempted
        fresh = [c for c in planned if c.key not in self.attempted]
        self.attempted.update(c.key for c in fresh)
        finished = [c for c in fresh if not self.force and store.finished(c)]
        old = [(store.get(c), c) for c in finished if not self.check.current(store.get(c), c)]
        if old and self.stale == "stop":
            raise UserError(self.check.message(self.task.name, self.out, old, len(finished)))
        summary.stale += len(old)
        todo = [c for c in fresh if self.force or not self.is_done(c)]
        summary.skipped += len(fresh) - len(todo)
        if len(fresh) > len(todo):
            log.info(
                "%s: %d cells already finished under %s: skipped", self.task.name, len(fresh) - len(todo), self.out
            )
        self.bar.total += len(todo)
        self.lines.total += len(todo)
        # cells that results just unlocked (a final stage) go first: a dataset finishes while others still run
        self.queue.extend(todo) if first else self.queue.extendleft(reversed(todo))

    def start(self, cell, after_wait: bool) -> bool:
        """Lock `cell` and submit it; False when another run holds it (the caller keeps it for later)."""
        lock = self.store.lock(cell)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        try:
            # finished already, or by the run that held the lock (fresh even under --force); by the code at hand
            if self.is_done(cell) and (after_wait or not self.force):
                lock.release()
                self.summary.skipped += 1
                self.bar.update(1)
                self.lines.done += 1
                self.changed = True
                return True
            self.inflight[self.executor.submit(cell)] = (cell, lock, 0)
        except BaseException:
            lock.release()
            raise
        return True

    def finish(self, future) -> None:
        from .futures import WorkerLost

        cell, lock, attempt = self.inflight.pop(future)
        try:
            try:
                outcome = future.result()
            except WorkerLost as e:
                if attempt < self.retries:
                    self.inflight[self.executor.submit(cell)] = (cell, lock, attempt + 1)
                    lock = None  # still held, by the new attempt
                    return
                outcome = lost_outcome(e, attempt + 1)
            if "stop" in outcome:  # the user's to fix (missing data on a worker, a bad option)
                raise UserError(outcome["stop"])
            status = _write_record(cell, outcome, self.store, self.summary, self.config)
            setattr(self.summary, status, getattr(self.summary, status) + 1)
            self.summary.add_caches(outcome.get("caches"))
            self.bar.update(1)
            self.lines.cell(cell, outcome)
            self.changed = True
        finally:
            if lock is not None:
                lock.release()

    def step(self) -> bool:
        """Replan if anything finished, start what may start, wait for a cell; False once nothing is left."""
        if self.changed:
            self.changed = False
            self.replan()
        if not (self.queue or self.held or self.inflight):
            return False
        slots = self.executor.slots
        for key in list(self.held):  # another run let go: skip what it finished, compute the rest
            if len(self.inflight) < slots and self.start(self.held[key], after_wait=True):
                del self.held[key]
        while self.queue and len(self.inflight) < slots:
            cell = self.queue.popleft()
            if not self.start(cell, after_wait=False):
                self.held[cell.key] = cell
        self.show()
        if not self.inflight:
            if self.held:
                time.sleep(0.2)
            return True
        timeout = 0.5 if self.held else None
        done, _ = wait(list(self.inflight), timeout=timeout, return_when=FIRST_COMPLETED)
        for future in done:
            self.finish(future)
        return True

    def run(self, ctx) -> RunSummary:
        with self.ledger.held():  # while the run lasts: the inline executor's cells count in it
            self.executor.start(self.adapter, ctx)
            interrupted = True
            try:
                while self.step():
                    pass
                self.show()
                interrupted = False
            finally:
                self.executor.close(interrupted=interrupted)
                for _cell, lock, _ in self.inflight.values():  # interrupted: nothing of theirs was written
                    lock.release()
                self.bar.close()
        return self.summary


def headline(cell, outcome: dict) -> str:
    """The cell's metric as one short phrase: 'accuracy 45.21 (test)', 'failed: REASON' or 'diverged: REASON'."""
    if outcome["status"] != "ok":
        reason = (outcome.get("reason") or "").strip().splitlines()
        return f"{outcome['status']}: {reason[0] if reason else 'no reason given'}"
    metrics = outcome.get("metrics") or {}
    first = ("val", "test") if cell.stage == "select" else ("test", "val")  # what the stage is judged on
    for split in (*first, *metrics):
        value = (metrics.get(split) or {}).get(cell.metric)
        if isinstance(value, (int, float)):
            return f"{cell.metric} {value:.4g} ({split})"
    return "ok"


def _clock(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class CellLines:
    """Progress for a log file: when stderr is not a terminal (Slurm, nohup, CI) tqdm's bars are off, so each
    finished cell gets one line instead: time, task, dataset, backbone, stage, seed, its headline metric or why
    it failed, cells done / planned, elapsed time and an ETA from the cells computed so far. On a terminal
    (or with `enabled` False) it prints nothing: the bars show progress there."""

    def __init__(self, task_name: str, enabled: bool, stream=None, axes=()):
        self.stream = stream if stream is not None else sys.stderr
        self.axes = tuple(axes)  # swept hyper-parameters: what tells a dataset's cells apart (shots, lr, ...)
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(enabled) and not isatty()
        self.task, self.started, self.computed = task_name, time.monotonic(), 0
        self.done = self.total = 0  # cells of this run: finished (computed or found finished) / planned

    def cell(self, cell, outcome: dict) -> None:
        self.done += 1
        self.computed += 1
        if not self.enabled:
            return
        done, total = self.done, self.total
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.computed * max(total - done, 0)
        stage = f" {cell.stage}" if cell.stage else ""
        stage += "".join(f" {k}={cell.hparams[k]}" for k in self.axes if k in cell.hparams)
        when = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
        print(
            f"{when} {self.task} {cell.dataset} {cell.backbone}{stage} seed {cell.seed}: {headline(cell, outcome)}"
            f" | {done}/{total} cells, {_clock(elapsed)} elapsed, ETA {_clock(eta)}",
            file=self.stream,
            flush=True,
        )


def _write_record(cell, outcome: dict, store: RecordStore, summary: RunSummary, config: dict | None = None) -> str:
    status = outcome["status"]
    if status == "failed":
        summary.failures.append(f"{cell.dataset} {cell.backbone} seed {cell.seed}: {outcome['reason']}")
    record = record_of(cell, outcome, summary.run_id, config)
    if outcome.get("samples"):  # written first: a record that names its samples always has them beside it
        record["samples"] = store.write_samples(record, outcome["samples"])
    store.write(record)
    return status
