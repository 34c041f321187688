"""What the command line runs, as library calls (lm-eval's `simple_evaluate`): a task's run into a records folder
with its checks in the order that loses no work, the dry-run plan and its cost table, the results file beside the
records, and the nightly run gated against a baseline. The command line only parses options and calls these."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError

if TYPE_CHECKING:
    from .engine.runner import RunOptions


def records_folder(out: Path) -> list[Path]:
    """Make `out` (and its parents) or say in one line why it cannot be; returns the folders it made, so that a
    run stopped by bad input before any cell can remove them again."""
    made = [p for p in (out, *out.parents) if not p.exists()][::-1]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        remove_empty(made)
        raise UserError(
            f"--out {out}: cannot write the records folder there ({e.strerror or e}); give a writable folder"
        ) from None
    return made


def remove_empty(folders: list[Path]) -> None:
    for p in reversed(folders):
        try:
            p.rmdir()
        except OSError:
            pass


def check_backbones(task, given: list[str] | None) -> list[str]:
    """`given`, else the suite's backbones, each checked by what costs nothing (name, checkpoint header)."""
    from .adapters import check_backbone

    names = given or list(task.backbones or [])
    if not names:
        raise UserError(
            f"give --backbone (e.g. --backbone b32,b32_dpn); suite {task.suite or 'all'!r} of task "
            f"{task.name!r} names no default backbones"
        )
    for name in names:
        check_backbone(name)
    return names


def prepare(task, names: list[str], out: Path, data_dir=None) -> tuple[list, list[Path]]:
    """Make `out` and check the data (removing the folders it made when either fails), then resolve the checked
    backbones `names` (NAME@embedded may pretrain); returns their cell.BackboneRefs and the folders made."""
    from .adapters import resolve_backbone
    from .engine.runner import CellContext
    from .paths import check_home, clean_home

    check_home()  # before anything is generated or cached there
    clean_home()
    made = records_folder(out)
    try:
        if hasattr(task.adapter, "check_data"):
            task.adapter.check_data(task, CellContext("cpu", data_dir=data_dir))
        return [resolve_backbone(b) for b in names], made
    except UserError:
        remove_empty(made)
        raise


def run_cells(task, backbones: list, out: Path, options: RunOptions, executor, made: list[Path]):
    """Run every cell of `task` for `backbones` into `out` with `executor`; prints and returns the summary. When
    the executor cannot start (no Ray cluster there), the folders `made` for this run go again, being empty."""
    from .engine.runner import run_task

    local = options.executor_name == "local"
    jobs = f", {options.jobs} jobs" if local else ""
    how = "" if local and options.jobs == 1 else f" ({options.executor_name} executor{jobs})"
    print(
        f"{task.name}: suite {task.suite or 'all'}, {len(task.datasets)} datasets, seeds "
        f"{','.join(map(str, task.seeds))}, {len(backbones)} backbones -> {out}{how}",
        file=sys.stderr,
    )
    try:
        summary = run_task(task, backbones, out, options, executor=executor)
    except UserError:
        remove_empty(made)
        raise
    print(f"{task.name}: {summary.line()}", file=sys.stderr)
    for f in summary.failures:
        print(f"  failed: {f}", file=sys.stderr)
    return summary


def run(task, names: list[str], out: Path, options: RunOptions, executor, reference: str | None = None) -> int:
    """One task into `out`: the checks that cost nothing first, then the data, then pretraining (NAME@embedded)
    and the cells; then the table (printed) and `results.json` beside the records. Returns the exit code."""
    from .records.store import RESULTS_FILE, load_records
    from .reporting.formats import render
    from .reporting.kinds import report_tables

    if reference and reference not in names:
        raise UserError(f"--reference {reference!r} is not among --backbone {','.join(names)}")
    backbones, made = prepare(task, names, out, options.data_dir)
    summary = run_cells(task, backbones, out, options, executor, made)
    folder = out / task.name
    records = [r for r in load_records([folder]) if r["backbone"] in names] if folder.is_dir() else []
    if records:
        tables = report_tables(records, reference=reference)
        print(render(tables))
        write_results(folder / RESULTS_FILE, task, options.config, summary, records, tables)
    return 1 if summary.failed else 0


def write_results(path: Path, task, config: dict, summary, records: list, tables: list) -> None:
    """lm-eval's results file: what ran (options, versions), what happened (the run's counts) and the table's rows,
    beside the records; rewritten by each run of the task into this folder."""
    from .engine.runner import environment
    from .paths import atomic_path
    from .reporting.formats import render
    from .reporting.provenance import report_header

    body = {
        "task": task.name,
        "suite": task.suite,
        "protocol_version": task.spec.protocol_version,
        "config": config,
        "environment": environment(),
        "run": {
            "run_id": summary.run_id,
            "ok": summary.ok,
            "diverged": summary.diverged,
            "failed": summary.failed,
            "skipped": summary.skipped,
            "stale": summary.stale,
            "stale_policy": summary.stale_policy,
            "caches": summary.caches,
        },
        "results": json.loads(render(tables, "json", header=report_header(records, tables))),
    }
    with atomic_path(path, needed=0, what="results file") as tmp:
        tmp.write_text(json.dumps(body, indent=1, default=str))
    print(f"wrote {path}", file=sys.stderr)


def dry_run(task, specs: list[str], out: Path, device: str, *, probe_device: bool = False) -> str:
    """The plan of `task` for backbones `specs` and its cost, as markdown: cells per stage (selection stages taken
    as decided), those with records in `out`, the images they train on and, where `device` has been probed (or
    `probe_device` probes it now), the device-hours of those training steps. Nothing is run, written or
    pretrained: a weights provider's backbone (NAME@embedded) is planned without its weights."""
    from tabulate import tabulate

    from .backbones.weights import providers, resolve_backbone, split_backbone
    from .cell import BackboneRef
    from .engine.estimate import full_plan, probe, stages, trained_shapes
    from .records.store import RecordStore

    refs = []
    for spec in specs:
        backbone, weights = split_backbone(spec)
        unresolved = weights in providers()  # NAME@embedded may pretrain: not in a dry run (its keys stay unknown)
        refs.append(
            BackboneRef(spec, backbone, None, f"{weights}-weights-unresolved") if unresolved else resolve_backbone(spec)
        )
    cells = full_plan(task, refs)
    if probe_device:
        for shape in trained_shapes(task, cells):
            print(f"probing {shape[0]} at {shape[1]} px on {device} ...", file=sys.stderr)
            probe(device, *shape)
    rows = stages(task, cells, RecordStore(out) if out.is_dir() else None, device)
    probed = all(not st.unprobed for st in rows)
    hours = (lambda h: f"{h:,.2f}") if probed else (lambda h: "?")
    table = [[st.name, st.cells, st.finished, f"{st.images:,}", hours(st.hours)] for st in rows]
    total = [sum(getattr(st, k) for st in rows) for k in ("cells", "finished", "images", "hours")]
    table.append(["all", total[0], total[1], f"{total[2]:,}", hours(total[3])])
    headers = ["stage", "cells", f"with records in {out}", "training images", f"device-hours ({device})"]
    lines = [
        f"### {task.name} — suite {task.suite or 'all'}, {len(task.datasets)} datasets, seeds "
        f"{','.join(map(str, task.seeds))}, backbones {', '.join(r.spec for r in refs)} (dry run)\n",
        tabulate(table, headers, tablefmt="github"),
    ]
    missing = sorted({shape for st in rows for shape in st.unprobed})
    if missing:
        lines.append(
            f"\nno estimate: {', '.join(f'{n} at {r} px' for n, r in missing)} not probed on {device}; add --probe "
            "(a few training steps of each, cached)"
        )
    else:
        lines.append(
            "\ndevice-hours: training steps only, at the probed rate per image (evaluation and data loading not "
            "counted; on a GPU a larger batch is usually faster per image, so this is an upper bound)"
        )
    return "\n".join(lines)


def nightly(
    baseline: Path,
    out: Path,
    date: str,
    *,
    suite: str = "nightly",
    tasks: list[str] | None = None,
    backbones: list[str] | None = None,
    seeds=None,
    gate: dict,
    allow_missing=(),
    options: RunOptions,
    executor,
    rolling: Path | None = None,
) -> tuple[str, int]:
    """The nightly regression run: each task's `suite` into `out/date` (resumable), its `bf16: auto` steps pinned to
    the `baseline` records' choices, then gated as `regress` does (`gate`: floor, alpha, accept, accept_code), with
    REGRESSION.md and LEADERBOARD.md written there. Every task, backbone and data set is checked before the first
    cell runs.

    With `rolling` (a folder of rolling baselines, one per arithmetic), the night is gated, exact tier first,
    against the rolling baseline of its own arithmetic where there is one, and statistically against `baseline`
    as a fixed anchor (a fault the rolling baseline absorbed, or a slow drift, still shows there); a passing night
    becomes its arithmetic's rolling baseline. Returns (report, exit code)."""
    import dataclasses

    from .adapters import prepare_task
    from .arithmetic import pins_of
    from .records.store import load_records

    if not date or "/" in date or date.startswith("."):
        raise UserError(f"--date {date!r}: give a plain folder name such as 2026-11-23")
    base = [r for r in load_records([baseline]) if (r.get("suite") or "") == suite]
    names = tasks or sorted({r["task"] for r in base})
    if not names:
        raise UserError(
            f"--baseline {baseline} holds no records of suite {suite!r}: give a records folder "
            f"of a `transferbench run TASK --suite {suite}` (or --tasks to run without a baseline)"
        )
    prepared = [prepare_task(t, suite=suite, seeds=seeds) for t in names]
    current = out / date
    chosen = {t.name: check_backbones(t, backbones) for t in prepared}
    resolved = {t.name: prepare(t, chosen[t.name], current, options.data_dir) for t in prepared}
    options = dataclasses.replace(options, pins=pins_of(base))
    for task in prepared:
        refs, made = resolved[task.name]
        run_cells(task, refs, current, options, executor, made)
    ran = {(t.spec.task, b) for t in prepared for b in chosen[t.name]}
    night = Night(baseline, current, date, suite, ran, named=backbones is not None)
    text, code = night.gate(base, load_records([current]), gate, allow_missing, rolling)
    (current / "REGRESSION.md").write_text(text)
    _write_board(current)
    return text, code


@dataclass
class Night:
    """One night's folders and what ran in it, for its gate."""

    baseline: Path
    current: Path
    date: str
    suite: str
    ran: set  # (task, backbone)
    named: bool = False  # the backbones were named (--backbone): the baseline's others are not expected tonight

    def expected(self, r: dict) -> bool:
        """Whether tonight should hold this baseline record: every backbone of the tasks run, unless named."""
        if self.named:
            return (r["task"], r["backbone"]) in self.ran
        return r["task"] in {task for task, _ in self.ran}

    def gate(self, base: list, tonight: list, gate: dict, allow_missing, rolling: Path | None):
        """(report, exit code): against this arithmetic's rolling baseline (both tiers) and the anchor `base`
        (statistical tier only) with `rolling`; against the anchor alone (both tiers) without it, or where this
        arithmetic has no rolling baseline yet. A passing night replaces its rolling baseline."""
        from .arithmetic import arithmetic_key
        from .records.store import load_records
        from .reporting.regress import verdict

        options = dict(
            floor=gate["floor"],
            alpha=gate["alpha"],
            accept=gate["accept"],
            accept_code=gate.get("accept_code", ()),
            fail_on_missing=True,
            fail_on_failed=True,
            allow_missing=allow_missing,
        )
        anchor = [r for r in base if self.expected(r)]
        key = arithmetic_key(tonight)
        roll = rolling / key if rolling is not None else None
        title = f"Nightly {self.date}: {self.current} vs"
        if roll is None or not roll.is_dir():
            text, code = verdict(anchor, tonight, **options, title=f"{title} {self.baseline}")
            if rolling is not None:
                text += f"\n\nNo rolling baseline of this arithmetic ({key}) in {rolling}: gated against the anchor.\n"
        else:
            last = [r for r in load_records([roll]) if self.mine(r) and self.expected(r)]
            text, code = verdict(last, tonight, **options, title=f"{title} the rolling baseline {roll}")
            title = f"Against the anchor {self.baseline} (statistical tier)"
            more, code2 = verdict(anchor, tonight, **options, exact=False, title=title)
            text, code = text + "\n\n" + more.replace("# Against", "## Against", 1), max(code, code2)
        if roll is not None and code == 0:
            keep_rolling(self.current, roll, len(tonight))
        return text, code

    def mine(self, r: dict) -> bool:
        return (r.get("suite") or "") == self.suite


def keep_rolling(night: Path, roll: Path, records: int) -> None:
    """Tonight's records become the rolling baseline `roll` (never one smaller than the one it replaces)."""
    import shutil

    from .records.store import load_records

    if roll.is_dir() and len(load_records([roll])) > records:
        print(f"kept the rolling baseline {roll}: it holds more records than tonight's", file=sys.stderr)
        return
    roll.parent.mkdir(parents=True, exist_ok=True)
    tmp = roll.with_name(f".{roll.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(night, tmp, ignore=shutil.ignore_patterns(".locks", "*.md", "*.png", "*.svg"))
    old = roll.with_name(f".{roll.name}.old{os.getpid()}")
    if roll.is_dir():
        os.replace(roll, old)
    os.replace(tmp, roll)
    shutil.rmtree(old, ignore_errors=True)
    print(f"tonight's records are the rolling baseline {roll}", file=sys.stderr)


def _write_board(current: Path) -> None:
    from .engine.runner import environment
    from .reporting.leaderboard import write_leaderboard

    board = write_leaderboard([current], current / "LEADERBOARD.md", git_sha=environment()["git_sha"])
    print(f"wrote {current / 'REGRESSION.md'} and {board}", file=sys.stderr)
