"""The tests' kit, so that each test states only what it checks: a record in the real schema (the runner's own
`records.store.record_of`), the one tiny training profile, and a command line written as one string."""

from __future__ import annotations

import shlex
import sys

from transferbench.cell import Cell

ENV = {"device": "cpu: AMD EPYC x2", "torch": "2.14.1", "numpy": "2.4.6", "timm": "1.0.31", "python": "3.11.7"}

# the one tiny profile of the end-to-end tests: a few steps of a few images at 8 px, two seeds
TINY = {"steps": 3, "batch": 8, "warmup_steps": 1, "resolution": 8}


def tiny(task: str, **more) -> list[str]:
    """The tiny profile as `--set` options, those of its settings (and `more`) that `task` takes."""
    from transferbench.spec import load_task, settings_model

    fields = settings_model(load_task(task).adapter).model_fields
    return [f"{k}={v}" for k, v in {**TINY, **more}.items() if k in fields]


def tiny_args(task: str, **more) -> str:
    """`tiny(task)` as command-line text, with the profile's seeds and no progress output."""
    return " ".join(f"--set {s}" for s in tiny(task, **more)) + " --seeds 0,1 --no-progress"


def embedded_home(suite_home, home):
    """A home holding the embedded suite of `suite_home` (conftest) as hard links: instant, and safe for tests that
    only read the sets (a test that damages a set makes a home of its own)."""
    import os
    import shutil

    shutil.copytree(
        suite_home / "embedded", home / "embedded", copy_function=os.link, ignore=shutil.ignore_patterns("*.lock")
    )
    return home


def cli(line: str, *extra) -> int:
    """`transferbench LINE` in this process (shell quoting), its exit code; `extra` are further arguments (paths)."""
    from transferbench.cli import main

    return main([*shlex.split(line), *map(str, extra)])


def cli_argv(line: str, *extra) -> list[str]:
    """The argv that runs `transferbench LINE` in a fresh interpreter (subprocess tests)."""
    return [sys.executable, "-m", "transferbench.cli", *shlex.split(line), *map(str, extra)]


def record(
    task: str = "vtab",
    dataset: str = "d",
    backbone: str = "b",
    seed: int = 0,
    metrics: dict | None = None,
    *,
    stage: str = "final",
    hparams: dict | None = None,
    status: str = "ok",
    environment: dict | None = None,
    **fields,
) -> dict:
    """A finished cell's record as the runner writes it (records.store.record_of): identity fields hash to its key.
    `fields` set the cell's other fields (metric, mode, select, group, order, suite, report, protocol_version,
    dataset_config, data_version) or, failing that, the record's own (finished_at, info, ...)."""
    from transferbench.records.store import record_of

    cell_fields = {k: fields.pop(k) for k in list(fields) if k in Cell.__dataclass_fields__}
    cell = Cell(
        **{
            "task": task,
            "dataset": dataset,
            "backbone": backbone,
            "checkpoint_sha256": "random-init",
            "hparams": dict(hparams or {}),
            "seed": seed,
            "protocol_version": "2",
            "stage": stage,
            **cell_fields,
        }
    )
    outcome = {
        "status": status,
        "reason": None if status == "ok" else "broken",
        "metrics": metrics if metrics is not None else {"test": {"accuracy": 50.0}},
        "info": {},
        "seconds": 1.0,
        "environment": dict(environment or ENV),
    }
    return {**record_of(cell, outcome, run_id="test"), **fields}


def mounted_tmpfs(folder, options: str):
    """A generator for a pytest fixture: a tmpfs mounted on `folder` (made) with mount `options` ('size=64k', 'ro'),
    unmounted after; the test is skipped where this is not root or mounting fails."""
    import os
    import subprocess

    import pytest

    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs failed here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
