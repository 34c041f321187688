"""Run a task's plan: in-process and sequential by default, resumable, safe against kill -9 and
against a second run writing into the same folder."""
from __future__ import annotations

import dataclasses
import math
import os
import platform
import subprocess
import sys
import time
import traceback
import uuid
from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from tqdm.auto import tqdm

from ..errors import UserError
from ..reporting.aggregate import select_best
from ..reporting.records import FINISHED, RecordStore, Timeout


class Diverged(Exception):
    """Raised by a training loop whose loss is not finite: the cell is recorded as `diverged`."""


def check_finite(value, what: str = "loss", step: int | None = None) -> None:
    v = float(value)
    if not math.isfinite(v):
        raise Diverged(f"non-finite {what} {v}" + (f" at step {step}" if step is not None else ""))


@dataclass
class CellContext:
    """What an adapter's `run` gets besides the cell: where and how to compute, none of which changes
    a cell's result (so none is part of its key): device (None: the worker's default, cuda where it has one),
    data directory, DataLoader workers, the largest micro-batch (gradient accumulation; None = the whole
    batch) and progress bars."""
    device: str | None
    show_progress: bool = True
    data_dir: str | None = None
    workers: int = 0
    micro_batch: int | None = None

    def progress(self, iterable: Iterable | None = None, total: int | None = None, desc: str = ""):
        return tqdm(iterable, total=total, desc=desc, leave=False, position=1, dynamic_ncols=True,
                    disable=None if self.show_progress else True)


class Results:
    """Planning's view of the records: adapters ask it which setting won a finished first stage."""

    def __init__(self, store: RecordStore):
        self.store = store

    def best(self, cells: list) -> dict | None:
        """The winning `select` setting among `cells` once all of them are finished, else None."""
        if not cells:
            return None
        recs = [self.store.get(c) for c in cells]
        if any(r is None or r["status"] not in FINISHED for r in recs):
            return None
        return select_best(recs, cells[0].select, cells[0].mode)


@dataclass
class RunSummary:
    run_id: str
    ok: int = 0
    diverged: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.ok} ok, {self.diverged} diverged, {self.failed} failed, "
                f"{self.skipped} skipped (already finished)")


@lru_cache(maxsize=1)
def environment() -> dict:
    import numpy
    import timm
    import torch

    from .. import __version__
    env = {"python": platform.python_version(), "platform": platform.platform(), "transferbench": __version__,
           "torch": torch.__version__, "timm": timm.__version__, "numpy": numpy.__version__,
           "device": _device_name(), "git_sha": _git_sha(), "host": platform.node()}
    return env


def _device_name() -> str:
    import torch
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"cpu: {platform.processor() or 'unknown'} x{os.cpu_count()}"


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_task(task, backbones: list, out, *, adapter=None, force: bool = False, executor=None,
             show_progress: bool = True, device: str | None = None, data_dir: str | None = None, workers: int = 0,
             micro_batch: int | None = None, retries: int = 1) -> RunSummary:
    """Plan and run every cell of `task` for `backbones` into the records folder `out`, with `adapter`
    (default: the one the task was resolved with, `task.adapter`; the engine never looks adapters up).
    An adapter with a `check_data(task, ctx)` method checks its data first (a UserError stops the run
    before any cell).

    `executor` (engine.executors; default: this process, one cell at a time) computes the cells; this
    function alone plans, locks and writes records. The plan is asked again whenever cells finish, so a
    second stage (VTAB's final cells) starts as soon as its first stage is done while other datasets still
    run. A cell whose worker process died (engine.executors.WorkerLost) is submitted again up to `retries`
    times, then recorded failed."""
    from .executors import InlineExecutor, WorkerLost

    adapter = adapter or task.adapter
    if adapter is None:
        raise TypeError("run_task needs the task's adapter: resolve the task with transferbench.adapters.prepare_task "
                        "or pass adapter=")
    store = RecordStore(out)
    store.remove_stale_temps()
    results = Results(store)
    executor = executor or InlineExecutor()
    ctx = CellContext(device, show_progress, data_dir, workers, micro_batch)
    if hasattr(adapter, "check_data"):
        adapter.check_data(task, ctx)
    summary = RunSummary(uuid.uuid4().hex[:12])
    attempted: set[str] = set()  # planned in this run: computed, skipped, or queued (failed ones wait for a rerun)
    queue: deque = deque()  # cells to compute: plan order, newly unlocked ones first
    held: dict[str, object] = {}  # cells whose lock another run holds: computed or skipped once it lets go
    inflight: dict = {}  # future -> (cell, lock, attempt)
    bar = tqdm(total=0, desc=f"{task.name} cells", unit="cell", position=0, dynamic_ncols=True,
               disable=None if show_progress else True)

    def show():
        bar.set_postfix_str(f"running {len(inflight)}, failed {summary.failed}"
                            + (f", waiting on another run {len(held)}" if held else ""), refresh=True)

    def replan():
        planned = list({c.key: c for b in backbones for c in adapter.plan(task, b, results)}.values())
        first = not attempted
        fresh = [c for c in planned if c.key not in attempted]
        attempted.update(c.key for c in fresh)
        todo = [c for c in fresh if force or not store.finished(c)]
        summary.skipped += len(fresh) - len(todo)
        bar.total += len(todo)
        # cells that results just unlocked (a final stage) go first: a dataset finishes while others still run
        queue.extend(todo) if first else queue.extendleft(reversed(todo))

    changed = True  # a cell finished (here or in another run): the plan may have grown

    def start(cell, after_wait: bool) -> bool:
        """Lock `cell` and submit it; False when another run holds it (the caller keeps it for later)."""
        nonlocal changed
        lock = store.lock(cell)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        try:
            # finished already, or by the run that held the lock (fresh even under --force)
            if store.finished(cell) and (after_wait or not force):
                lock.release()
                summary.skipped += 1
                bar.update(1)
                changed = True
                return True
            inflight[executor.submit(cell)] = (cell, lock, 0)
        except BaseException:
            lock.release()
            raise
        return True

    def finish(future) -> None:
        nonlocal changed
        cell, lock, attempt = inflight.pop(future)
        try:
            try:
                outcome = future.result()
            except WorkerLost as e:
                if attempt < retries:
                    inflight[executor.submit(cell)] = (cell, lock, attempt + 1)
                    lock = None  # still held, by the new attempt
                    return
                outcome = lost_outcome(e, attempt + 1)
            if "stop" in outcome:  # the user's to fix (missing data on a worker, a bad option)
                raise UserError(outcome["stop"])
            status = _write_record(cell, outcome, store, summary)
            setattr(summary, status, getattr(summary, status) + 1)
            bar.update(1)
            changed = True
        finally:
            if lock is not None:
                lock.release()

    executor.start(adapter, ctx)
    interrupted = True
    try:
        while True:
            if changed:
                changed = False
                replan()
            if not (queue or held or inflight):
                break
            for key in list(held):  # another run let go: skip what it finished, compute the rest
                if len(inflight) < executor.slots and start(held[key], after_wait=True):
                    del held[key]
            while queue and len(inflight) < executor.slots:
                cell = queue.popleft()
                if not start(cell, after_wait=False):
                    held[cell.key] = cell
            show()
            if not inflight:
                if held:
                    time.sleep(0.2)
                continue
            done, _ = wait(list(inflight), timeout=0.5 if held else None, return_when=FIRST_COMPLETED)
            for future in done:
                finish(future)
        show()
        interrupted = False
    finally:
        executor.close(interrupted=interrupted)
        for cell, lock, _ in inflight.values():  # interrupted: nothing of theirs was written
            lock.release()
        bar.close()
    return summary


def compute_cell(adapter, cell, ctx: CellContext) -> dict:
    """Run one cell where the executor put it and return its outcome (status, metrics, info, reason,
    seconds, environment, traceback): everything its record needs besides the cell. A UserError comes back
    as {"stop": message}: the runner stops the run with it."""
    if ctx.device is None:
        ctx = dataclasses.replace(ctx, device=default_device())
    started = time.time()
    metrics, info, reason, tb = {}, {}, "", None
    try:
        result = dict(adapter.run(cell, ctx) or {})
        info = result.pop("info", {})
        metrics = _check_metrics(result, cell)
        status = "ok"
    except Diverged as e:
        status, reason = "diverged", str(e)
    except UserError as e:
        return {"stop": str(e)}
    except Exception as e:  # noqa: BLE001 - one broken cell must not stop the plan
        status, reason, tb = "failed", f"{type(e).__name__}: {e}", traceback.format_exc()
    if status == "ok" and any(not math.isfinite(v) for split in metrics.values() for v in split.values()):
        status, reason = "diverged", "non-finite metric"
    return {"status": status, "reason": reason, "metrics": metrics, "info": info,
            "seconds": round(time.time() - started, 3), "environment": environment(), "traceback": tb}


def lost_outcome(error: Exception, attempts: int) -> dict:
    """The outcome of a cell whose worker died on every attempt: failed, so that a rerun tries it again."""
    return {"status": "failed", "reason": f"{type(error).__name__}: {error} ({attempts} attempt"
                                          f"{'s' if attempts > 1 else ''})",
            "metrics": {}, "info": {}, "seconds": 0.0, "environment": environment(), "traceback": None}


def _write_record(cell, outcome: dict, store: RecordStore, summary: RunSummary) -> str:
    status = outcome["status"]
    if status == "failed":
        summary.failures.append(f"{cell.dataset} {cell.backbone} seed {cell.seed}: {outcome['reason']}")
    record = {**cell.to_dict(), "key": cell.key, "status": status, "reason": outcome["reason"],
              "metrics": outcome["metrics"], "info": outcome["info"], "seconds": outcome["seconds"],
              "run_id": summary.run_id, "finished_at": datetime.now(timezone.utc).isoformat(),
              "environment": outcome["environment"], "argv": sys.argv[1:]}
    if outcome.get("traceback"):
        record["traceback"] = outcome["traceback"]
    store.write(record)
    return status


def _check_metrics(result: dict, cell) -> dict:
    metrics = {}
    for split, values in result.items():
        if not isinstance(values, dict):
            raise TypeError(f"adapter returned {split}={values!r}; expected {{split: {{metric: value}}}}")
        metrics[split] = {k: float(v) for k, v in values.items()}
    if not any(cell.metric in m for m in metrics.values()):
        raise ValueError(f"adapter returned no {cell.metric!r} metric (splits: {sorted(metrics)})")
    return metrics
