"""transferbench command line: list, run, pretrain, data, report, leaderboard, regress, nightly. One module per
command (its options and the call into the library); the options several commands share live in `options`."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..errors import UserError
from ..paths.writes import RESUME
from . import data, ls, pretrain, regress, report, run
from .options import apply_deprecated, with_config

EXAMPLES = """\
examples:
  transferbench list backbones
  transferbench list tasks
  transferbench run vtab --suite embedded        # offline mini-VTAB, shipped mu4 checkpoints; cost: docs/install.md
  transferbench run vtab --backbone b32,b32_dpn --reference b32 --data-dir ~/tensorflow_datasets
  transferbench run seg --suite embedded         # ADE20K's linear-decoder protocol on the embedded scenes
  transferbench run seg --backbone b16,b16_dpn@b16_dpn.npz --data-dir data/ade --reference b16
  transferbench pretrain --backbone mu4,mu4_dpn,mu4_dtn --suite embedded
  transferbench run vtab --suite embedded --backbone mu4@embedded,mu4_dpn@embedded --seeds 0,1
  transferbench data export-vtab --data-dir ~/tensorflow_datasets --out ~/vtab-1k
  transferbench report runs/vtab --reference b32
  transferbench leaderboard runs/vtab runs/fewshot -o results/LEADERBOARD.md
  transferbench regress --baseline nightly/2026-11-21 --current nightly/2026-11-22
  transferbench run vtab --suite embedded --jobs 2                # two cells at once on this machine
  transferbench run vtab --backbone b16,b16_dpn --executor ray --address auto --gpus-per-cell 1 --data-dir /shared/tfds
  transferbench nightly --baseline results/nightly --out nightly   # the nightly suite, gated
  transferbench run vtab,fewshot --suite embedded --jobs 2        # several tasks, one after another
  transferbench run --config run.yaml                               # options kept in a file
"""
ENVIRONMENT = """environment:
  TRANSFERBENCH_HOME    embedded data and every cache (features, corruptions, classifiers, LiT towers,
                        pretrained checkpoints); default ~/.cache/transferbench. Must be writable.
  TFDS_DATA_DIR         prepared tfds data, when --data-dir is not given; default ~/tensorflow_datasets
  CUDA_VISIBLE_DEVICES  the GPUs cells may use (--jobs N gives each worker its own)
"""
CONVENTIONS = """\
conventions: -o always names an output file (report, leaderboard, regress); --out names a folder (run,
  nightly, data export-vtab). The old short forms -o (a records folder), -b (--backbone) and -j (--jobs) still work
  with a one-line note: timm users read -b as batch size and -j as loader workers.
"""


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(
        prog="transferbench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES + "\n" + ENVIRONMENT + "\n" + CONVENTIONS,
        description="Does a change to a ViT's stem or normaliser transfer? Runs task adapters over "
        "backbones into resumable records and reports means with 95% confidence intervals.",
    )
    p.add_argument("--version", action="version", version=f"transferbench {__version__}")
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more output: -v logs decisions (cache hits, reused records), -vv debug detail",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="less output: no progress bars or per-cell lines, and no warnings (errors still show)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ls.add_parser(sub)
    run_parser = run.add_parser(sub)
    pretrain_parser = pretrain.add_parser(sub)
    data.add_parser(sub)
    report.add_parsers(sub)
    nightly_parser = regress.add_parsers(sub)
    for sp in (run_parser, pretrain_parser, nightly_parser):
        sp.epilog = (sp.epilog or "") + "\n\n" + ENVIRONMENT
    p.run_parser = run_parser  # main() reads --config against run's options
    return p


COMMANDS = {
    "list": ls.command,
    "run": run.command,
    "pretrain": pretrain.command,
    "data": data.command,
    "report": report.report,
    "leaderboard": report.leaderboard,
    "regress": regress.regress,
    "nightly": regress.nightly,
    "reanchor": regress.reanchor,
    "accept": regress.accept,
}


class _Stderr(logging.Handler):
    """The transferbench logger's lines on whatever sys.stderr is at the time (one line each)."""

    def emit(self, record):
        print(self.format(record), file=sys.stderr)


def _verbosity(args) -> None:
    log = logging.getLogger("transferbench")
    log.setLevel(logging.ERROR if args.quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)])
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        log.addHandler(_Stderr())
    if args.quiet and hasattr(args, "no_progress"):
        args.no_progress = True


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "config", None):
            args = with_config(parser, argv if argv is not None else sys.argv[1:], args)
        apply_deprecated(args)
        _verbosity(args)
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:
        # the reader went away (`transferbench report runs | head -3`): stop quietly, as command-line tools
        # do; stdout goes to /dev/null so that the interpreter's own final flush does not complain
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    except UserError as e:
        print(f"transferbench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"transferbench: interrupted; {RESUME}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
