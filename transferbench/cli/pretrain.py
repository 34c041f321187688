"""`transferbench pretrain`: run task `pretrain` for backbones into the checkpoint cache (NAME@embedded)."""

from __future__ import annotations

import argparse

from ..errors import UserError
from .options import backbone_option, execution_options, set_option, subcommand

PRETRAIN_HELP = """\
pretrain backbones upstream (writes checkpoints for NAME@embedded)

Run task `pretrain` (DPN App. C, the AugReg recipe; numbers in tasks/pretrain.yaml) for each backbone into
$TRANSFERBENCH_HOME/pretrain. Backbones written NAME@embedded elsewhere resolve to these checkpoints (and pretrain
on demand when one is missing).

examples:
  transferbench pretrain --backbone mu4,mu4_dpn,mu4_dtn --suite embedded
  transferbench run vtab --suite embedded --backbone mu4@embedded,mu4_dpn@embedded
"""


def add_parser(sub) -> argparse.ArgumentParser:
    pt = subcommand(sub, "pretrain", PRETRAIN_HELP)
    backbone_option(pt, "comma-separated backbone names (required)")
    pt.add_argument("--suite", "-s", default="embedded", help="pretraining data and profile (default: embedded)")
    set_option(pt, "override a hyper-parameter; note that it changes the cell, so NAME@embedded will not use it")
    execution_options(pt)
    return pt


def command(args) -> int:
    from ..paths.home import cache
    from .run import command as run

    if not args.backbone:
        raise UserError("give --backbone (e.g. --backbone mu4,mu4_dpn,mu4_dtn)")
    args.task, args.datasets, args.seeds, args.reference = ["pretrain"], None, None, None
    args.dry_run = args.probe = False  # `run pretrain` plans and estimates; this command trains
    args.out = cache("pretrain")
    args.stale = args.stale or "recompute"  # a cache: a pretraining of other code is done again unless kept
    return run(args)
