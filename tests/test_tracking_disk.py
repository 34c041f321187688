"""W&B around the run, as a user meets it in a terminal: a full disk under --log-dir is one warning line per process
and leaves no W&B run reading as running unnamed; W&B writes nothing outside --log-dir, and the log folder alone,
copied elsewhere, is read whole by W&B's own offline tools (`wandb sync --dry-run`, `wandb leet inspect`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kit import cli_argv, embedded_home, mounted_tmpfs

pytest.importorskip("tensorboard", reason="the tracking extra is not installed")
pytest.importorskip("wandb", reason="the tracking extra is not installed")

RUN = "run vtab --suite embedded --datasets mini_digits --backbone mu4@embedded --seeds 0 --no-progress"


def _run(line: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", **env}
    return subprocess.run(cli_argv(line), env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


def _state(folder: Path) -> dict:
    """W&B's own inspector's summary of a run folder (its state, name, summary)."""
    argv = [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(folder)]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout)


@pytest.fixture
def small_tmpfs(tmp_path):
    # 100 kB: W&B's first cell's run fits, the second cell's run and the report do not
    yield from mounted_tmpfs(tmp_path / "logs", "size=100k")


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_full_log_disk_is_one_warning_a_process_and_no_run_left_running_unnamed(
    suite_home, small_tmpfs, tmp_path, jobs
):
    # seen before: 20 tracebacks (924 stderr lines) with --jobs 1, 60 (2,726 lines) with --jobs 2, from Python's
    # logging failing to write W&B's debug.log; and a cell's run left "running" that no warning named
    home = embedded_home(suite_home, tmp_path / "home")
    done = _run(
        f"{RUN} --jobs {jobs} --out {tmp_path / 'runs'} --log-to wandb --log-dir {small_tmpfs}",
        {"TRANSFERBENCH_HOME": str(home)},
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert not [x for x in lines if x.startswith((" ", "\t", "Traceback", "---", "OSError", "Call stack"))], lines
    warnings = [x for x in lines if x.startswith("transferbench: warning: --log-to wandb failed")]
    # one a process: the driver (its report) and, with --jobs 2, each of the two workers; each says the cells go on
    assert 1 <= len(warnings) <= (1 if jobs == 1 else 3), warnings
    assert all("no space left on device" in w.lower() and "the cells go on" in w for w in warnings)
    assert len(lines) == 4 + len(warnings), lines  # the run's own four lines, and the warnings
    records = sorted((tmp_path / "runs" / "vtab").rglob("*.json"))
    assert len(records) == 1 + 2  # every cell finished (the seed's select and final) and the summary
    named = "\n".join(warnings)
    states = {run: _state(run)["state"] for run in sorted(small_tmpfs.glob("wandb/offline-run-*"))}  # each read once
    assert states
    for run, state in states.items():
        assert state in ("finished", "failed") or str(run) in named, (run, state, named)
    assert "finished" in states.values()  # the disk filled mid-run, not at once


@pytest.mark.slow
def test_wandb_writes_only_under_the_log_dir_and_a_copy_of_it_is_whole(suite_home, tmp_path):
    # seen before: a debug log per cell in ~/.cache/wandb/logs, artifact staging in ~/.local/share/wandb that the
    # report's run named by absolute path, W&B's media and artifact folders in /tmp
    home = embedded_home(suite_home, tmp_path / "home")
    user, tmp = tmp_path / "user", tmp_path / "tmp"
    user.mkdir()
    tmp.mkdir()
    logs = tmp_path / "logs"
    done = _run(
        f"{RUN} --jobs 2 --out {tmp_path / 'runs'} --log-to wandb,tensorboard --log-dir {logs}",
        {
            "TRANSFERBENCH_HOME": str(home),
            "HOME": str(user),
            "TMPDIR": str(tmp),
            "XDG_CACHE_HOME": "",
            "XDG_DATA_HOME": "",
        },
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warning" not in done.stderr, done.stderr
    outside = [p for root in (user, tmp) for p in root.rglob("*") if "wandb" in str(p.relative_to(root)).lower()]
    assert outside == [], outside[:5]

    copy = tmp_path / "elsewhere" / "logs"
    shutil.copytree(logs, copy)
    shutil.rmtree(logs)
    sync = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run", str(copy / "wandb")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(user)},
    )
    runs = sorted(copy.glob("wandb/offline-run-*"))
    assert len(runs) == 2 + 1  # a run per cell and the report's
    listed = sync.stdout + sync.stderr
    assert f"Would sync {len(runs)} run(s)" in listed, listed
    for run in runs:
        assert f"{run.name}/run-" in listed
        summary = _state(run)
        assert summary["state"] == "finished", (run, summary["state"])
        if summary["name"].endswith("/report"):
            tables = {k: v for k, v in summary["summary"].items() if k.startswith("tables/")}
            assert tables and all(v["_type"] == "table-file" for v in tables.values()), tables
            for value in tables.values():  # each table a file of the copied run, read back whole
                table = json.loads((run / "files" / value["path"]).read_text())
                assert table["columns"] and table["data"], value
