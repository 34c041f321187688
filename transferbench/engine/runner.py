"""Run a task's plan: in-process and sequential by default, resumable, safe against kill -9 and
against a second run writing into the same folder."""
from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

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
    a cell's result (so none is part of its key): device, data directory, DataLoader workers, the
    largest micro-batch (gradient accumulation; None = the whole batch) and progress bars."""
    device: str
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


class LocalExecutor:
    """One cell after another in this process."""

    def map(self, fn: Callable, cells: list) -> list:
        return [fn(c) for c in cells]


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
           "device": _device_name(), "git_sha": _git_sha()}
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
             micro_batch: int | None = None) -> RunSummary:
    """Plan and run every cell of `task` for `backbones` into the records folder `out`, with `adapter`
    (default: the one the task was resolved with, `task.adapter`; the engine never looks adapters up).
    An adapter with a `check_data(task, ctx)` method checks its data first (a UserError stops the run
    before any cell)."""
    adapter = adapter or task.adapter
    if adapter is None:
        raise TypeError("run_task needs the task's adapter: resolve the task with transferbench.adapters.prepare_task "
                        "or pass adapter=")
    store = RecordStore(out)
    store.remove_stale_temps()
    results = Results(store)
    executor = executor or LocalExecutor()
    ctx = CellContext(device or default_device(), show_progress, data_dir, workers, micro_batch)
    if hasattr(adapter, "check_data"):
        adapter.check_data(task, ctx)
    summary = RunSummary(uuid.uuid4().hex[:12])
    attempted: set[str] = set()
    bar = tqdm(total=0, desc=f"{task.name} cells", unit="cell", position=0, dynamic_ncols=True,
               disable=None if show_progress else True)
    try:
        while True:
            planned = list({c.key: c for b in backbones for c in adapter.plan(task, b, results)}.values())
            todo = []
            for c in planned:
                if c.key in attempted:
                    continue
                if not force and store.finished(c):
                    attempted.add(c.key)
                    summary.skipped += 1
                    continue
                todo.append(c)
            if not todo:
                break
            bar.total += len(todo)
            bar.refresh()
            attempted.update(c.key for c in todo)

            def attempt(cell, wait=False):
                lock = store.lock(cell)
                try:
                    lock.acquire(timeout=-1 if wait else 0)
                except Timeout:
                    return "busy"
                try:
                    # finished already, or by the run whose lock we waited for (fresh even under --force)
                    if store.finished(cell) and (wait or not force):
                        summary.skipped += 1
                        return "skipped"
                    status = _run_cell(adapter, cell, ctx, store, summary)
                    setattr(summary, status, getattr(summary, status) + 1)
                    return status
                finally:
                    lock.release()
                    bar.update(1)

            busy = [c for c, s in zip(todo, executor.map(attempt, todo)) if s == "busy"]
            for cell in busy:  # held by another run: wait for it, then skip or compute
                attempt(cell, wait=True)
    finally:
        bar.close()
    return summary


def _run_cell(adapter, cell, ctx: CellContext, store: RecordStore, summary: RunSummary) -> str:
    started = time.time()
    metrics, info, reason, tb = {}, {}, "", None
    try:
        result = dict(adapter.run(cell, ctx) or {})
        info = result.pop("info", {})
        metrics = _check_metrics(result, cell)
        status = "ok"
    except Diverged as e:
        status, reason = "diverged", str(e)
    except (KeyboardInterrupt, UserError):
        raise  # the user's to fix (missing data, bad option): stop the run, keep what is finished
    except Exception as e:  # noqa: BLE001 - one broken cell must not stop the plan
        status, reason, tb = "failed", f"{type(e).__name__}: {e}", traceback.format_exc()
        summary.failures.append(f"{cell.dataset} {cell.backbone} seed {cell.seed}: {reason}")
    if status == "ok" and any(not math.isfinite(v) for split in metrics.values() for v in split.values()):
        status, reason = "diverged", "non-finite metric"
    record = {**cell.to_dict(), "key": cell.key, "status": status, "reason": reason, "metrics": metrics,
              "info": info, "seconds": round(time.time() - started, 3), "run_id": summary.run_id,
              "finished_at": datetime.now(timezone.utc).isoformat(), "environment": environment(),
              "argv": sys.argv[1:]}
    if tb:
        record["traceback"] = tb
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
