"""`transferbench data export-vtab`: VTAB-1k from prepared tfds data as image folders."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UserError
from .options import csv_list, deprecated, subcommand

DATA_HELP = """\
prepare data: export VTAB to image folders
"""


EXPORT_VTAB_HELP = """\
write VTAB-1k from prepared tfds data as image folders

Write each VTAB task's train800 / val200 / test (and train800val200) from prepared tfds data into the image-folder
format: PNG (lossless), split lists, sha256 manifest, info.json.

examples:
  transferbench data export-vtab --data-dir ~/tensorflow_datasets --out ~/vtab-1k
  transferbench data export-vtab --tasks cifar100,dtd --out ~/vtab-1k
"""


def add_parser(sub) -> argparse.ArgumentParser:
    data = subcommand(sub, "data", DATA_HELP)
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    ex = subcommand(data_sub, "export-vtab", EXPORT_VTAB_HELP)
    ex.add_argument("--data-dir", help="tfds data dir (default: $TFDS_DATA_DIR, else ~/tensorflow_datasets)")
    ex.add_argument("--out", type=Path, help="folder to write <task>/ into (required)")
    deprecated(ex, "-o", type=Path)
    ex.add_argument("--tasks", type=csv_list, help="comma-separated VTAB tasks (default: all 19)")
    ex.add_argument("--limit", type=int, help="at most this many examples per split (a quick look, not the protocol)")
    ex.add_argument("--no-progress", action="store_true")
    return data


def command(args) -> int:
    from tqdm.auto import tqdm

    if args.out is None:
        raise UserError("give --out, the folder to write the VTAB tasks into")
    from ..data.vtab import export_vtab, task

    for name in args.tasks or []:
        task(name)  # unknown names fail before any work, with close matches
    progress = None if args.no_progress else (lambda it, **kw: tqdm(it, leave=False, **kw))
    for path in export_vtab(args.out, args.tasks, data_dir=args.data_dir, limit=args.limit, progress=progress):
        print(f"wrote {path}", file=sys.stderr)
    return 0
