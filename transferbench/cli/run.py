"""`transferbench run`: plan and run tasks' cells into a records folder (or print the plan with --dry-run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UserError
from .options import (
    backbone_option,
    check_execution_options,
    csv_list,
    deprecated,
    execution_options,
    seeds_option,
    set_option,
    subcommand,
    tracking_options,
)

RUN_HELP = """\
run a task's cells (skips finished ones)

Plan and run every cell of TASK for each backbone. Each finished cell writes one record under --out; a rerun skips
finished cells (ok or diverged) and retries failed ones, so an interrupted run resumes where it stopped. Bad input
(a name, a --set value of the wrong type, an unreadable checkpoint, an unwritable --out) stops it with one line
before the data is checked, and missing data before any pretraining or cell.

examples:
  transferbench run vtab --backbone b32,b32_dpn
  transferbench run vtab --suite embedded --backbone mu4@ckpt.safetensors --set steps=100
  transferbench run my_task.yaml --backbone s16 --datasets cifar100 --seeds 0
  transferbench run vtab --backbone b16@deit_b16.pth --set pixels=imagenet   # ImageNet mean/std input
  transferbench run vtab --backbone b32@b32.npz --set final=retrain        # VPT's retrain on train+val

  transferbench run vtab --backbone timm:vit_base_patch16_224.augreg_in21k,b16_dpn@mine.safetensors \\
      --reference timm:vit_base_patch16_224.augreg_in21k   # a tag from the local Hugging Face cache
  transferbench run fewshot --backbone py:mypkg.models:make_model@weights.safetensors

backbones: NAME (random init) or NAME@CHECKPOINT (.safetensors, .pth, big_vision .npz);
  timm:MODEL[.TAG][@FILE] (any timm ViT); py:MODULE:FACTORY[@FILE] (a factory returning a module with
  timm's API: docs/backbones.md#the-backbone-api)
config: a YAML mapping such as {task: vtab, suite: embedded, backbone: [mu4, mu4_dpn], jobs: 2,
  set: {steps: 100}}
pixels: every task's `pixels: auto` feeds the normalisation the weights state (ours: in the header;
  big_vision .npz: [-1, 1]); a file that states none gets inception ([-1, 1]) and the run says so
"""


def add_parser(sub) -> argparse.ArgumentParser:
    run = subcommand(sub, "run", RUN_HELP)
    run.add_argument(
        "task",
        nargs="?",
        type=csv_list,
        help="comma-separated installed tasks (`transferbench list tasks`) or spec .yaml files, run one after "
        "another into the same --out",
    )
    run.add_argument(
        "--config",
        type=Path,
        help="a YAML file of run's options (keys as the long options without dashes: task, backbone, suite, "
        "datasets, seeds, set, out, jobs, ...); options on the command line override it, and the "
        "resolved options are stored in each record",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan instead of running it: cells per stage (selection stages taken as decided), those "
        "with records in --out, the images they train on and, where this device has been probed, the "
        "device-hours of those training steps; no data, no records, no pretraining",
    )
    run.add_argument(
        "--probe",
        action="store_true",
        help="with --dry-run: first time a few training steps of each model shape the plan trains on this "
        "device (seconds on a GPU; cached in $TRANSFERBENCH_HOME/cost-probe)",
    )
    backbone_option(run, "comma-separated backbones (default: the suite's)")
    run.add_argument("--suite", "-s", help="dataset subset and hyper-parameter profile (`transferbench list suites`)")
    run.add_argument("--datasets", "-d", type=csv_list, help="comma-separated subset of the suite's datasets")
    seeds_option(run, "comma-separated seeds (default: the spec's)")
    set_option(run, "override a hyper-parameter or sweep, e.g. --set steps=100 --set lr=0.01,0.03 (repeatable)")
    run.add_argument(
        "--out",
        default=Path("runs"),
        type=Path,
        help="records folder (default: runs); each task's results.json (options, versions, the table's rows) "
        "is written beside its records",
    )
    deprecated(run, "-o", type=Path)
    execution_options(run)
    tracking_options(run)
    run.add_argument("--reference", help="backbone to compare against in the closing table")
    return run


def command(args) -> int:
    if not args.task:
        raise UserError("give a task (`transferbench run vtab`, several as vtab,fewshot) or a --config file with task:")
    if args.probe and not args.dry_run:
        raise UserError("--probe measures this device for --dry-run's estimate: give --dry-run as well")
    code = 0
    for name in args.task:  # each checked in full before its own cells; a later task's bad input stops there
        code = max(code, dry_run(name, args) if args.dry_run else run_one(name, args))
    return code


def dry_run(name: str, args) -> int:
    from .. import workflows
    from ..adapters import prepare_task
    from ..engine.compute import default_device

    task = prepare_task(name, suite=args.suite, datasets=args.datasets, seeds=args.seeds, sets=args.sets)
    specs = workflows.check_backbones(task, args.backbone)
    print(workflows.dry_run(task, specs, args.out, args.device or default_device(), probe_device=args.probe))
    return 0


def run_one(name: str, args) -> int:
    from .. import workflows
    from ..adapters import prepare_task
    from ..records.store import RESULTS_FILE
    from ..reporting.formats import render
    from .tracked import log_task

    # the checks that cost nothing come first, then the data, then pretraining (NAME@embedded) and cells
    task = prepare_task(name, suite=args.suite, datasets=args.datasets, seeds=args.seeds, sets=args.sets)
    names = workflows.check_backbones(task, args.backbone)
    options, executor = check_execution_options(args)  # workflows.run checks --reference against `names` first
    done = workflows.run(task, names, args.out, options, executor, reference=args.reference)
    if done.records:
        print(render(done.tables))
        path = args.out / task.name / RESULTS_FILE
        workflows.write_results(path, task, options.config, done.summary, done.records, done.tables)
        folder, trackers = args.out / task.name, options.trackers
        log_task(options.tracking, task.name, task.suite, folder, done.tables, args.reference, trackers=trackers)
    return done.code
