"""`transferbench list`: backbones, tasks (and one task's settings), suites, adapters."""

from __future__ import annotations

import argparse

from ..errors import UserError
from .options import subcommand

LIST_HELP = """\
list backbones, tasks, suites or adapters

examples:
  transferbench list backbones
  transferbench list suites
  transferbench list tasks --show vtab              # every setting: default, each suite's, source
  transferbench list tasks --show fewshot --suite embedded --format markdown
  transferbench list references --task vtab         # published numbers, each with its source
"""


def add_parser(sub) -> argparse.ArgumentParser:
    ls = subcommand(sub, "list", LIST_HELP)
    ls.add_argument("what", choices=["backbones", "tasks", "suites", "adapters", "references"])
    ls.add_argument(
        "--show",
        metavar="TASK",
        help="with `tasks`: TASK's settings, each with its paper default, each suite's value and the source of its "
        "default (all: every built-in task's, with --format markdown: docs/settings.md)",
    )
    ls.add_argument("--suite", "-s", help="with --show: only this suite's column")
    ls.add_argument("--task", help="with `references`: only this task's published numbers")
    ls.add_argument("--format", "-f", default="text", choices=["text", "markdown"], help="with --show (default text)")
    return ls


def command(args) -> int:
    from tabulate import tabulate

    if args.show and args.what != "tasks":
        raise UserError(f"--show names a task's settings: `transferbench list tasks --show {args.show}`")
    if args.task and args.what != "references":
        raise UserError(f"--task picks a task's published numbers: `transferbench list references --task {args.task}`")
    if args.what == "backbones":
        from ..backbones.registry import BACKBONE_COLUMNS, backbone_rows

        print(tabulate(backbone_rows(), BACKBONE_COLUMNS, tablefmt="github"))
        print(
            "\nAlso any timm ViT as timm:MODEL[.TAG][@FILE] (timm.list_models('*vit*')) and your own module as "
            "py:MODULE:FACTORY[@FILE]: docs/backbones.md#bring-your-own-vit"
        )
    elif args.what == "references":
        _references(args.task, tabulate)
    elif args.what == "adapters":
        from ..adapters import list_adapters

        print("\n".join(list_adapters()) or "no adapters installed")
    elif args.show:
        from ..settings import settings_markdown, settings_table
        from ..spec import BUILTIN_TASKS

        tasks = list(BUILTIN_TASKS) if args.show == "all" else [args.show]
        suites = None if args.suite is None else [args.suite]
        if args.format == "markdown":
            print(settings_markdown(tasks, suites), end="")
        for task in tasks if args.format == "text" else ():
            headers, rows = settings_table(task, suites)
            print(f"{task}\n\n{tabulate(rows, headers, tablefmt='simple', disable_numparse=True)}\n")
    else:
        print(_specs_table(args.what, tabulate))
    return 0


def _specs_table(what: str, tabulate) -> str:
    from ..spec import installed_specs, load_spec_file

    specs = {n: load_spec_file(p, defaults=False) for n, p in installed_specs().items()}  # no torch: names only
    if not specs:
        return "no tasks installed"
    if what == "tasks":
        rows = [
            [n, ", ".join(s.aliases) or "-", s.adapter, len(s.datasets), ", ".join(s.suites) or "-", s.description]
            for n, s in specs.items()
        ]
        return tabulate(rows, ["task", "aliases", "adapter", "datasets", "suites", "description"], tablefmt="github")
    rows = [
        [n, name, len(suite.datasets or s.datasets), suite.description]
        for n, s in specs.items()
        for name, suite in s.suites.items()
    ]
    return tabulate(rows, ["task", "suite", "datasets", "description"], tablefmt="github")


def _references(task, tabulate) -> None:
    """The published numbers (reporting.published), each with its conditions and source."""
    from ..reporting.published import reference_rows
    from ..spec import BUILTIN_TASKS

    if task is not None and task not in BUILTIN_TASKS:
        raise UserError(f"--task {task!r} is not a task; tasks: {', '.join(BUILTIN_TASKS)}")
    headers, rows = reference_rows(task)
    if not rows:
        print(f"no published numbers carried over for {task} yet (docs: transferbench/reporting/published.py)")
        return
    print(tabulate(rows, headers, tablefmt="github", disable_numparse=True))
