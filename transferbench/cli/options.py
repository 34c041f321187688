"""Options that several commands share, declared once: list types, the old short forms, the execution options
(run, pretrain, nightly), the regression gate's (regress, nightly), --strict, and run's --config file."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..errors import UserError, close_matches
from ..fingerprint import STALE
from ..settings.choices import COMPILE


def csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def subcommand(sub, name: str, text: str) -> argparse.ArgumentParser:
    """Subcommand `name` of `sub` (an add_subparsers action), its help laid out in `text` as a docstring is: a
    summary line (the list of commands in the parent's --help), then the description's paragraphs (each printed as
    one line, for the terminal to wrap), then, from a line `examples:` or `example:` on, the epilog as written."""
    head, *examples = re.split(r"^(?=examples?:$)", text.strip("\n"), maxsplit=1, flags=re.M)
    summary, _, about = head.strip("\n").partition("\n\n")
    paragraphs = [" ".join(p.split()) for p in about.split("\n\n") if p.strip()]
    return sub.add_parser(
        name,
        help=summary,
        description="\n\n".join(paragraphs) or None,
        epilog=examples[0].rstrip("\n") if examples else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def patterns_option(p: argparse.ArgumentParser, flag: str, metavar: str, help: str) -> None:
    """An option of comma-separated patterns; given alone, with no value, it names every one ('*')."""
    p.add_argument(flag, nargs="?", const=["*"], default=[], type=csv_list, metavar=metavar, help=help)


DEPRECATED = {"_old_o": ("-o", "--out"), "_old_b": ("-b", "--backbone"), "_old_j": ("-j", "--jobs")}


def deprecated(p: argparse.ArgumentParser, short: str, **kw) -> None:
    """An old short option kept working (main() moves its value to the long one and says so in one line)."""
    dest = next(d for d, (old, _) in DEPRECATED.items() if old == short)
    p.add_argument(short, dest=dest, help=argparse.SUPPRESS, **kw)


def apply_deprecated(args) -> None:
    for dest, (old, new) in DEPRECATED.items():
        value = getattr(args, dest, None)
        if value is not None:
            print(
                f"transferbench: note: {old} is deprecated here; use {new} (-o names an output file in every "
                "command; -b and -j mean batch size and workers to timm users)",
                file=sys.stderr,
            )
            setattr(args, new.lstrip("-").replace("-", "_"), value)
        if hasattr(args, dest):
            delattr(args, dest)


def execution_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="recompute cells that already have a record")
    p.add_argument(
        "--stale",
        choices=STALE[1:],  # stop: the default, asked for by giving none
        help="what to do with finished cells whose record another code or library version computed (each record "
        "holds the fingerprint of the code that computed it): by default the run stops before computing anything "
        "and names how many differ and what changed; recompute: compute them again; keep: keep them as finished "
        "(report and leaderboard then name both fingerprints and say the table mixes them)",
    )
    p.add_argument("--device", help="torch device for the cells (default: cuda if available, else cpu)")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress output: no bars on a terminal, and no per-cell lines where stderr is a file "
        "(Slurm, nohup, CI), where each finished cell otherwise gets one line with its metric, "
        "cells done / planned and an ETA",
    )
    p.add_argument(
        "--data-dir",
        help="where datasets are: a tfds data dir (default: $TFDS_DATA_DIR, else "
        "~/tensorflow_datasets) or a folder from `transferbench data export-vtab`",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="DataLoader worker processes per cell (default 0: load in the main process). No part of a cell's key; "
        "its record's arithmetic digest holds it, so the gate judges two records to the bit only where both ran "
        "with the same",
    )
    p.add_argument(
        "--log-samples",
        action="store_true",
        help="keep each cell's per-example test results (VTAB-1k, LiT zero-shot) in a compressed file "
        "beside its record; reports then compare single-seed cells per example (a paired bootstrap "
        "over examples). It changes no metric and no cell key",
    )
    p.add_argument(
        "--compile",
        nargs="?",
        const="on",
        default="auto",
        choices=COMPILE,
        help="run the training steps through torch.compile: auto (default) compiles them on CUDA and not on the "
        "CPU; bare --compile means on. One compilation per model shape serves every cell of the run; it is "
        "timed apart from the steps (a record's info: compile_s). Records equal the eager ones up to "
        "floating-point summation order; no cell key changes",
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        help="largest chunk of a batch run at once (gradient accumulation; "
        "default: the whole batch, halved automatically on out-of-memory)",
    )
    executor_options(p)


def executor_options(p: argparse.ArgumentParser) -> None:
    """Where cells run (the `executors` group of execution_options)."""
    g = p.add_argument_group(
        "executors",
        "where cells run; each keeps the same guarantees (records written atomically by this process, "
        "each cell computed once across runs into one --out, resumable). Records depend on the threads "
        "per cell, not the executor: the same --cpus-per-cell gives the same metrics with any of them",
    )
    g.add_argument(
        "--executor",
        default="local",
        metavar="{local,ray}",
        help="local: this machine (default); ray: one Ray task per cell on a Ray cluster "
        "(pip install 'transferbench[scale]')",
    )
    deprecated(p, "-j", type=int)
    g.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="local: cells at once, each in its own worker process with cores/N threads and, when "
        "several GPUs are visible, its own GPU (default without a GPU: 1, in this process, one at a time; with "
        "GPUs: 4 cells on each, sharing its memory, at least 2 cores apiece)",
    )
    g.add_argument(
        "--address",
        help="ray: the cluster to join: auto (`ray start` ran here), HOST:6379, or "
        "ray://HOST:10001 (Ray Client); default: start Ray on this machine",
    )
    g.add_argument(
        "--cpus-per-cell",
        type=float,
        help="CPUs (and torch threads) per cell (ray default 1; local "
        "default: cores/--jobs; --jobs 1 --cpus-per-cell 1 reproduces "
        "the records of --jobs 2 or Ray at 1 CPU per cell)",
    )
    g.add_argument(
        "--gpus-per-cell", type=float, help="ray: GPUs per cell (default: 1 when the cluster has GPUs, else 0)"
    )
    g.add_argument(
        "--retries",
        type=int,
        default=1,
        help="times a cell whose worker process died (killed, out of memory, a lost node) is started "
        "again before it is recorded failed (default 1)",
    )


def tracking_options(p: argparse.ArgumentParser) -> None:
    """Experiment trackers (run, nightly): execution options, in no cell key (transferbench.tracking)."""
    from ..tracking import DEFAULT_DIR, DEFAULT_PROJECT, WANDB_MODES

    g = p.add_argument_group(
        "tracking",
        "log each cell (its training curve, final metrics per split, wall time, settings with their sources) and, "
        "at the end, the report's tables and the leaderboard's figures to TensorBoard or Weights & Biases "
        "(pip install 'transferbench[tracking]'). Offline first; logging changes no number and no cell key, and a "
        "tracker that fails mid-run costs a warning, never a cell (docs/tracking.md)",
    )
    g.add_argument(
        "--log-to",
        type=csv_list,
        default=None,
        metavar="{tensorboard,wandb}",
        help="trackers, comma-separated: tensorboard (event files: tensorboard --logdir LOG_DIR) and/or wandb "
        "(offline runs unless --wandb-mode or WANDB_MODE says otherwise; wandb sync uploads them later)",
    )
    g.add_argument(
        "--log-dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"where entries go (default: {DEFAULT_DIR}/): TensorBoard's run folders, and W&B's wandb/ folder; "
        "beside the records folder, not inside it",
    )
    g.add_argument("--wandb-project", default=DEFAULT_PROJECT, help=f"W&B project (default: {DEFAULT_PROJECT})")
    g.add_argument("--wandb-entity", help="W&B entity (team or user; default: W&B's own default)")
    g.add_argument("--wandb-group", help="W&B group of every cell (default: TASK/SUITE, one group per task and suite)")
    g.add_argument(
        "--wandb-mode",
        metavar="{" + ",".join(WANDB_MODES) + "}",
        help="W&B mode (default: $WANDB_MODE, else offline: nothing reaches a network)",
    )


def tracking_of(args):
    """The tracker options as a tracking.Tracking, or None where none is asked for; a value outside the documented
    ones is one UserError (exit 2) naming the option, what it got and what it takes."""
    from ..tracking import KINDS, WANDB_MODES, Tracking

    mode = getattr(args, "wandb_mode", None)
    if mode is not None and mode not in WANDB_MODES:
        raise UserError(
            f"--wandb-mode {mode!r} is not a W&B mode; choose from {', '.join(WANDB_MODES)}"
            f"{close_matches(mode, WANDB_MODES)}"
        )
    for option in ("wandb_project", "wandb_entity", "wandb_group"):
        value = getattr(args, option, None)
        if value is not None and not value.strip():
            raise UserError(f"--{option.replace('_', '-')} is empty; give a name, or leave the option out")
    log_to = getattr(args, "log_to", None)
    if log_to is not None and not log_to:
        raise UserError(f"--log-to names no tracker; give one or more of {', '.join(KINDS)}, comma-separated")
    kinds = tuple(dict.fromkeys(log_to or ()))
    if not kinds:
        return None
    return Tracking(
        kinds=kinds,
        dir=args.log_dir,
        project=args.wandb_project,
        entity=args.wandb_entity,
        group=args.wandb_group,
        mode=args.wandb_mode,
    ).resolved()  # the folder and the mode decided in the driver, for every worker on any node


def strict_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--strict",
        action="store_true",
        help="stop (exit 2) on a file that is not a valid record instead of skipping it with a warning",
    )


def check_execution_options(args):
    """Checks the execution options; returns the run's options (engine.runner.RunOptions) and the executor they ask
    for (nothing is started yet)."""
    from ..engine.executors import default_jobs, make_executor
    from ..tracking import check

    if args.jobs is None:  # resolved here, so that records and results.json store what ran
        args.jobs = default_jobs() if args.executor == "local" else 1
    options = run_options(args)  # the options object checks its own values (engine.runner.RunOptions)
    check(options.tracking, getattr(args, "out", None))  # before any cell: the trackers import, the folder writes
    return options, make_executor(
        args.executor,
        jobs=args.jobs,
        address=args.address,
        cpus_per_cell=args.cpus_per_cell,
        gpus_per_cell=args.gpus_per_cell,
    )


def with_config(parser, argv, args):
    """run's options from --config (a YAML mapping), under the command line's: the file's values become the
    parser's defaults and the command line is parsed again."""
    import yaml

    try:
        data = yaml.safe_load(args.config.read_text())
    except OSError as e:
        raise UserError(f"--config {args.config}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise UserError(f"--config {args.config}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UserError(f"--config {args.config}: expected a mapping of run's options, e.g. {{task: vtab, jobs: 2}}")
    run = parser.run_parser
    actions = {a.dest: a for a in run._actions if a.dest not in ("help", "config") and not a.dest.startswith("_")}
    defaults = {}
    for key, value in data.items():
        dest = "sets" if key == "set" else str(key).replace("-", "_")
        if dest not in actions:
            raise UserError(
                f"--config {args.config}: unknown option {key!r}{close_matches(dest, actions)}; options: "
                f"{', '.join(sorted('set' if d == 'sets' else d for d in actions))}"
            )
        defaults[dest] = config_value(actions[dest], value, key, args.config)
    run.set_defaults(**defaults)
    return parser.parse_args(argv)


def config_value(action, value, key, source):
    """A YAML value as the option's own type: lists or comma-separated strings for list options, a mapping or
    list of KEY=VALUE for `set`, paths, numbers, booleans."""
    try:
        if action.dest == "sets":
            if isinstance(value, dict):
                return [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in value.items()]
            return [str(v) for v in (value if isinstance(value, list) else [value])]
        if isinstance(action, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise ValueError("expected true or false")
            return value
        if action.type in (csv_list, int_list) and isinstance(value, list):
            return action.type(",".join(map(str, value)))
        return action.type(str(value)) if action.type else value
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise UserError(f"--config {source}: {key}: {e}") from None


def backbone_option(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--backbone", type=csv_list, help=help)
    deprecated(p, "-b", type=csv_list)


def set_option(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help=help)


def seeds_option(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--seeds", type=int_list, help=help)


def output_option(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--output", "-o", type=Path, help=help)


def check_output(path: Path) -> None:
    """-o's file can be written (its folder made if missing, then a probe written there and removed), or one
    UserError naming the problem and the fix: checked before the command does its work, not after."""
    from ..paths.writes import probe

    fix = "give -o a file in a writable folder"
    if path.is_dir():
        raise UserError(f"-o {path} is a folder, not a file; {fix}")
    folder = path.parent
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"-o {path}: {existing} is a file, not a folder; {fix}")
    try:
        probe(folder)  # removes the folders it made where it cannot write
    except OSError as e:
        raise UserError(f"-o {path}: cannot write in {folder} ({(e.strerror or str(e)).lower()}); {fix}") from None


def reference_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reference",
        "-r",
        help="compare every backbone with this one (default: the plain backbone of the same weights source)",
    )


def run_options(args):
    """The execution options as engine.runner.RunOptions, with `config` the resolved options a record stores."""
    from ..engine.runner import RunOptions
    from ..tracking import Trackers

    tracking = tracking_of(args)
    same = ("force", "stale", "device", "data_dir", "workers", "micro_batch", "compile", "retries", "jobs")
    return RunOptions(
        **{k: getattr(args, k) for k in same},
        show_progress=not args.no_progress,
        log_samples=getattr(args, "log_samples", False),  # run's option; pretrain and nightly keep none
        executor_name=args.executor,
        tracking=tracking,
        trackers=Trackers() if tracking is not None else None,  # the command's: its cells here, then its report
        config=run_config(args),
    )


def run_config(args) -> dict:
    """run's resolved options as plain JSON values: stored in each record and in results.json."""
    skip = {"command", "config", "verbose", "quiet"}
    return {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in sorted(vars(args).items())
        if k not in skip and not k.startswith("_")
    }
