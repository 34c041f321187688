"""What the command line runs, as library calls (lm-eval's `simple_evaluate`): a task's run into a records folder
with its checks in the order that loses no work, the dry-run plan and its cost table, the results file beside the
records (the nightly run is transferbench.night's). The command line only parses options and calls these."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError
from .paths.writes import atomic_path, check_home, clean_home, probe, remove_empty

if TYPE_CHECKING:
    from .engine.runner import RunOptions


def records_folder(out: Path) -> list[Path]:
    """Make `out` (and its parents) or say in one line why it cannot be; returns the folders it made, so that a
    run stopped by bad input before any cell can remove them again."""
    try:
        return probe(out)
    except OSError as e:
        raise UserError(
            f"--out {out}: cannot write the records folder there ({e.strerror or e}); give a writable folder"
        ) from None


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
    from .engine.compute import CellContext

    check_home()  # before anything is generated or cached there
    clean_home()
    made = records_folder(out)
    try:
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
    if options.tracking is not None:  # where to point TensorBoard while the cells run
        from .tracking import where

        print(f"{task.name}: logging each cell to {where(options.tracking)}", file=sys.stderr)
    try:
        summary = run_task(task, backbones, out, options, executor=executor)
    except UserError:
        remove_empty(made)
        raise
    print(f"{task.name}: {summary.line()}", file=sys.stderr)
    for f in summary.failures:
        print(f"  failed: {f}", file=sys.stderr)
    return summary


@dataclass
class TaskRun:
    """What `run` returns: the run's summary, the records of its backbones in the task's folder (this run's and
    earlier ones') and their tables; printing and writing them is the caller's."""

    summary: object  # engine.runner.RunSummary
    records: list
    tables: list

    @property
    def code(self) -> int:
        """The command's exit code: 1 where a cell failed, else 0."""
        return 1 if self.summary.failed else 0


def run(task, names: list[str], out: Path, options: RunOptions, executor, reference: str | None = None) -> TaskRun:
    """One task into `out`: the checks that cost nothing first, then the data, then pretraining (NAME@embedded)
    and the cells; returns the summary, the records and their tables (`write_results` writes `results.json`)."""
    from .records.store import load_records
    from .reporting.kinds import report_tables

    if reference and reference not in names:
        raise UserError(f"--reference {reference!r} is not among --backbone {','.join(names)}")
    backbones, made = prepare(task, names, out, options.data_dir)
    summary = run_cells(task, backbones, out, options, executor, made)
    folder = out / task.name
    records = [r for r in load_records([folder]) if r["backbone"] in names] if folder.is_dir() else []
    return TaskRun(summary, records, report_tables(records, reference=reference) if records else [])


def write_results(path: Path, task, config: dict, summary, records: list, tables: list) -> None:
    """lm-eval's results file: what ran (options, versions), what happened (the run's counts) and the table's rows,
    beside the records; rewritten by each run of the task into this folder."""
    from .engine.compute import environment
    from .reporting.formats import json_data
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
        "results": json_data(tables, header=report_header(records, tables)),
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
