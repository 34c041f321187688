"""The worker side of one cell: where and how it computes (CellContext), running the adapter and turning what
happens into an outcome (compute_cell), and what a record says about the machine (environment). The runner, the
executors' workers and the training loop (Diverged, check_finite) all import it; it imports none of them."""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tqdm.auto import tqdm

from .. import git
from ..errors import UserError
from ..paths.ledger import held_ledger
from ..settings.choices import COMPILE


class Diverged(Exception):
    """Raised by a training loop whose loss is not finite: the cell is recorded as `diverged`."""


def check_finite(value, what: str = "loss", step: int | None = None) -> None:
    v = float(value)
    if not math.isfinite(v):
        raise Diverged(f"non-finite {what} {v}" + (f" at step {step}" if step is not None else ""))


@dataclass
class CellContext:
    """What an adapter's `run` gets besides the cell: where and how to compute, none of which is part of a cell's
    key. Device, workers, micro-batch, precision and compile may move a result's last bits (another summation
    order), so the record's arithmetic digest holds them (transferbench.arithmetic) and the gate judges two records
    to the bit only where it agrees: device (None: the worker's default, cuda where it has one),
    data directory, DataLoader workers, the largest micro-batch (gradient accumulation; None = the whole
    batch), precision pins (`pins`: per cell key, the bf16 choice of each `auto` step, in order), progress bars
    and whether per-example results are kept (`log_samples`: an adapter that can returns
    them under "samples", {split: bool array in the split's order}; the record's file beside it holds them) and
    whether the training steps run through torch.compile (`compile`: auto, the default, compiles them on CUDA;
    `compiles` resolves it) and the experiment trackers each cell logs to (`tracking`: transferbench.tracking; the
    process's `trackers`, tracking.Trackers: those that failed stay off). While a cell computes, its context also
    carries the cell's entry in those trackers (`log`, a tracking.CellLog or None: engine.train.fit sends its curves
    there) and the cache ledger held for it (`ledger`, paths.ledger.Ledger); `compute_cell` sets both."""

    device: str | None = None
    show_progress: bool = True
    data_dir: str | None = None
    workers: int = 0
    micro_batch: int | None = None
    log_samples: bool = False
    compile: bool | str = "auto"  # torch.compile the training steps: auto (on CUDA) | on | off (`compiles`)
    # cell key -> the precision each of its `bf16: auto` steps takes, in order (nightly: the baseline's choices)
    pins: dict | None = None
    tracking: object = None  # tracking.Tracking: the trackers each cell logs to (--log-to), or None
    trackers: object = None  # tracking.Trackers: this process's (None: the cell gets a fresh one)
    log: object = None  # tracking.CellLog: the computing cell's entry (compute_cell sets it), or None
    ledger: object = None  # paths.ledger.Ledger: the cache ledger held while the cell computes (compute_cell sets it)

    def progress(self, iterable: Iterable | None = None, total: int | None = None, desc: str = ""):
        return tqdm(
            iterable,
            total=total,
            desc=desc,
            leave=False,
            position=1,
            dynamic_ncols=True,
            disable=None if self.show_progress else True,
        )


# besides torch, timm and numpy: what else can change a record (image decoding and resizing, the text tower, the
# embedded data's generators, the corruption generator)
PACKAGES = (
    "torchvision",
    "open_clip_torch",
    "pillow",
    "scikit-learn",
    "scikit-image",
    "mlxtend",
    "scipy",
    "imagecorruptions-imaug",
    "tensorflow-datasets",
)


@lru_cache(maxsize=1)
def environment() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import numpy
    import timm
    import torch

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    sha, dirty = git.state()
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "transferbench": version("transferbench"),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "numpy": numpy.__version__,
        **{name: installed(name) for name in PACKAGES},
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": _device_name(),
        "git_sha": sha,
        "git_dirty": dirty,
        "host": platform.node(),
    }


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    from .precision import cpu_model

    return f"cpu: {cpu_model() or platform.processor() or 'unknown'} x{os.cpu_count()}"


COMPILE_MIN_EXAMPLES = 100_000  # auto: a training loop of fewer examples (steps x batch) runs eagerly


def compiles(setting, device: str | None, examples: int | None = None) -> bool:
    """Whether a training loop of `examples` (steps x batch; None: unknown, counted as many) on `device` runs through
    torch.compile, for a setting auto | on | off (or a bool). auto compiles on CUDA loops of at least
    COMPILE_MIN_EXAMPLES: a paper-scale cell (VTAB-1k: 2,500 steps of 512, 1.28 M) runs its steps faster compiled
    (benchmarks/paper_step.py), while the embedded suite's loops (a few thousand examples) would spend longer
    compiling than stepping; on the CPU a compilation costs more than the steps gain."""
    if isinstance(setting, bool):
        return setting
    if setting not in COMPILE:
        raise ValueError(f"compile={setting!r}; one of {', '.join(COMPILE)}")
    if setting != "auto":
        return setting == "on"
    return str(device or "").startswith("cuda") and (examples is None or examples >= COMPILE_MIN_EXAMPLES)


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cell_code(adapter, backbone: str):
    """The fingerprint of the code and libraries that compute a cell of `adapter` for backbone `backbone`
    (`NAME[@WEIGHTS]`): the adapter's module and the backbone family's (with their import closures), the core and
    data libraries and the adapter's own `libraries`. Each record keeps it; `run` compares it with the code at
    hand before it skips a finished cell."""
    from ..backbones.registry import backbone_code
    from ..fingerprint import CORE, DATA, of

    return of((type(adapter).__module__, *backbone_code(backbone)), CORE + DATA + tuple(adapter.libraries))


def compute_cell(adapter, cell, ctx: CellContext) -> dict:
    """Run one cell where the executor put it and return its outcome (status, metrics, info, reason,
    seconds, environment, traceback, the fingerprint of the code that computed it, the cache entries it read
    and computed): everything its record needs besides the cell. A UserError comes back as {"stop": message}:
    the runner stops the run with it. The cache entries are counted and checked in the ledger held in this process
    (`paths.ledger`: the run's), or in the cell's own where none is (a Ray task, a cell computed alone). The cell's
    context carries that ledger and the cell's tracker entry (`CellContext.ledger`, `.log`) to the adapter."""
    from ..tracking import Trackers

    ledger = held_ledger()
    trackers = ctx.trackers if ctx.trackers is not None else Trackers()
    with ledger.held(), trackers.cell_entry(ctx.tracking, cell, adapter.settings) as entry:
        outcome = _compute(adapter, cell, dataclasses.replace(ctx, trackers=trackers, log=entry, ledger=ledger))
        if entry is not None:  # the outcome to the cell's tracker entries (a failing tracker is a warning)
            entry.close(outcome if "stop" not in outcome else {"status": "stopped", "reason": outcome["stop"]})
        return outcome


def _compute(adapter, cell, ctx: CellContext) -> dict:
    from .. import arithmetic

    if ctx.device is None:
        ctx = dataclasses.replace(ctx, device=default_device())
    try:
        code = cell_code(adapter, cell.backbone).record()  # the code as the cell starts
    except UserError as e:
        return {"stop": str(e)}
    ledger = ctx.ledger
    before = ledger.snapshot()
    arithmetic.begin((ctx.pins or {}).get(cell.key))
    started = time.time()
    metrics, info, reason, tb, samples = {}, {}, "", None, {}
    try:
        result = dict(adapter.run(cell, ctx) or {})
        info = result.pop("info", {})
        samples = result.pop("samples", {}) if ctx.log_samples else {}
        result.pop("samples", None)
        metrics = _check_metrics(result, cell)
        status = "ok"
    except Diverged as e:
        status, reason = "diverged", str(e)
    except UserError as e:
        arithmetic.end()
        return {"stop": str(e)}
    except Exception as e:  # noqa: BLE001 - one broken cell must not stop the plan
        fault = environment_fault(e, ctx)
        if fault:  # the machine's, not the cell's: every later cell would meet it too
            arithmetic.end()
            return {"stop": fault}
        status, reason, tb = "failed", f"{type(e).__name__}: {e}", traceback.format_exc()
    if status == "ok" and any(not math.isfinite(v) for split in metrics.values() for v in split.values()):
        status, reason = "diverged", "non-finite metric"
    how = {"device": ctx.device, "workers": ctx.workers, "compile": ctx.compile, "micro_batch": ctx.micro_batch}
    arith, outputs = arithmetic.finish(
        metrics, **how, execution=getattr(cell, "execution", None), libraries=tuple(code["libraries"])
    )
    return {
        "status": status,
        "reason": reason,
        "metrics": metrics,
        "info": info,
        "seconds": round(time.time() - started, 3),
        "environment": environment(),
        "fingerprint": code,
        "arithmetic": arith,
        "outputs": outputs,
        "caches": ledger.since(before),
        "traceback": tb,
        **({"samples": samples} if status == "ok" and samples else {}),
    }


KILLED_WORKER = ("DataLoader worker", "killed by signal", "exited unexpectedly")


def environment_fault(e: BaseException, ctx: CellContext) -> str | None:
    """The one-line message for a failure of the machine rather than of the cell (a full or read-only disk, a
    data folder that vanished mid-run, a DataLoader worker killed by the system), or None. Such a failure
    stops the run: every later cell would meet it too."""
    import errno

    from ..paths.home import home
    from ..paths.writes import DISK_FULL, RESUME, write_error

    if isinstance(e, OSError):
        # a full or read-only disk; a permission error may come from a read, and stays the cell's
        err = write_error(e, e.filename or "?") if e.errno in DISK_FULL | {errno.EROFS} else None
        if err is not None:
            return str(err)
        if isinstance(e, FileNotFoundError) and e.filename:
            missing = Path(str(e.filename))
            for root, name, fix in (
                (ctx.data_dir, "--data-dir", "restore the data there (or give --data-dir where it is now)"),
                (
                    str(home()),
                    "$TRANSFERBENCH_HOME",
                    "keep the folder in place while cells run (embedded data is generated again on the rerun)",
                ),
            ):
                if root and Path(root).expanduser().resolve() in (missing.resolve(), *missing.resolve().parents):
                    return f"{name} {root}: {missing} vanished while a cell was reading it; {fix}, then {RESUME}"
    text = str(e)
    if isinstance(e, RuntimeError) and KILLED_WORKER[0] in text and any(k in text for k in KILLED_WORKER[1:]):
        return (
            f"{text.splitlines()[0].strip()} (the system killed a data-loading process; the usual cause is the "
            f"out-of-memory killer): rerun with fewer --workers (--workers 0 loads in the cell's own process) or "
            f"with more memory; {RESUME}"
        )
    return None


def lost_outcome(error: Exception, attempts: int) -> dict:
    """The outcome of a cell whose worker died on every attempt: failed, so that a rerun tries it again."""
    return {
        "status": "failed",
        "reason": f"{type(error).__name__}: {error} ({attempts} attempt{'s' if attempts > 1 else ''})",
        "metrics": {},
        "info": {},
        "seconds": 0.0,
        "environment": environment(),
        "traceback": None,
    }


def _check_metrics(result: dict, cell) -> dict:
    metrics = {}
    for split, values in result.items():
        if not isinstance(values, dict):
            raise TypeError(f"adapter returned {split}={values!r}; expected {{split: {{metric: value}}}}")
        metrics[split] = {k: float(v) for k, v in values.items()}
    if not any(cell.metric in m for m in metrics.values()):
        raise ValueError(f"adapter returned no {cell.metric!r} metric (splits: {sorted(metrics)})")
    return metrics
