"""transferbench command line: list, run, pretrain, data, report, leaderboard, regress, nightly."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .errors import UserError, close_matches

EXAMPLES = """\
examples:
  transferbench list backbones
  transferbench list tasks
  transferbench run vtab --suite embedded        # offline mini-VTAB, shipped mu4 checkpoints, ~8 min on 2 cores
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


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


DEPRECATED = {"_old_o": ("-o", "--out"), "_old_b": ("-b", "--backbone"), "_old_j": ("-j", "--jobs")}


def _deprecated(p: argparse.ArgumentParser, short: str, **kw) -> None:
    """An old short option kept working (main() moves its value to the long one and says so in one line)."""
    dest = next(d for d, (old, _) in DEPRECATED.items() if old == short)
    p.add_argument(short, dest=dest, help=argparse.SUPPRESS, **kw)


def _apply_deprecated(args) -> None:
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


def _execution_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="recompute cells that already have a record")
    p.add_argument(
        "--stale",
        choices=("recompute", "keep"),
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
        help="DataLoader worker processes per cell (default 0: load in the main process; results do not depend on it)",
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
        action="store_true",
        help="run the training steps through torch.compile (the first step of each model shape compiles, tens of "
        "seconds; records equal the eager ones up to floating-point summation order; no cell key changes)",
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        help="largest chunk of a batch run at once (gradient accumulation; "
        "default: the whole batch, halved automatically on out-of-memory)",
    )
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
    _deprecated(p, "-j", type=int)
    g.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="local: cells at once, each in its own worker process with cores/N threads and, when "
        "several GPUs are visible, its own GPU (default 1: in this process, one at a time)",
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


def _strict_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--strict",
        action="store_true",
        help="stop (exit 2) on a file that is not a valid record instead of skipping it with a warning",
    )


def _check_execution_options(args):
    """Checks the execution options and returns the executor they ask for (nothing is started yet)."""
    from .engine.executors import make_executor

    if args.workers < 0:
        raise UserError(f"--workers must be >= 0, got {args.workers}")
    if args.micro_batch is not None and args.micro_batch < 1:
        raise UserError(f"--micro-batch must be >= 1, got {args.micro_batch}")
    if args.retries < 0:
        raise UserError(f"--retries must be >= 0, got {args.retries}")
    return make_executor(
        args.executor,
        jobs=args.jobs,
        address=args.address,
        cpus_per_cell=args.cpus_per_cell,
        gpus_per_cell=args.gpus_per_cell,
    )


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    from . import __version__

    p = argparse.ArgumentParser(
        prog="transferbench",
        formatter_class=fmt,
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

    ls = sub.add_parser(
        "list",
        help="list backbones, tasks, suites or adapters",
        formatter_class=fmt,
        epilog="examples:\n  transferbench list backbones\n  transferbench list suites",
    )
    ls.add_argument("what", choices=["backbones", "tasks", "suites", "adapters"])

    run = sub.add_parser(
        "run",
        help="run a task's cells (skips finished ones)",
        formatter_class=fmt,
        description="Plan and run every cell of TASK for each backbone. Each finished cell writes one record "
        "under --out; a rerun skips finished cells (ok or diverged) and retries failed ones, so an "
        "interrupted run resumes where it stopped. Bad input (a name, a --set value of the wrong type, "
        "an unreadable checkpoint, an unwritable --out) stops it with one line before the data is "
        "checked, and missing data before any pretraining or cell.",
        epilog="examples:\n  transferbench run vtab --backbone b32,b32_dpn\n"
        "  transferbench run vtab --suite embedded --backbone mu4@ckpt.safetensors --set steps=100\n"
        "  transferbench run my_task.yaml --backbone s16 --datasets cifar100 --seeds 0\n"
        "  transferbench run vtab --backbone b16@deit_b16.pth --set pixels=imagenet   # ImageNet mean/std input\n"
        "  transferbench run vtab --backbone b32@b32.npz --set final=retrain        # VPT's retrain on train+val\n\n"
        "  transferbench run vtab --backbone timm:vit_base_patch16_224.augreg_in21k,b16_dpn@mine.safetensors \\\n"
        "      --reference timm:vit_base_patch16_224.augreg_in21k   # a tag from the local Hugging Face cache\n"
        "  transferbench run fewshot --backbone py:mypkg.models:make_model@weights.safetensors\n\n"
        "backbones: NAME (random init) or NAME@CHECKPOINT (.safetensors, .pth, big_vision .npz);\n"
        "  timm:MODEL[.TAG][@FILE] (any timm ViT); py:MODULE:FACTORY[@FILE] (a factory returning a module with\n"
        "  timm's API: docs/backbones.md#the-backbone-api)\n"
        "config: a YAML mapping such as {task: vtab, suite: embedded, backbone: [mu4, mu4_dpn], jobs: 2,\n"
        "  set: {steps: 100}}\n"
        "pixels: every task's `pixels: auto` feeds the normalisation the weights state (ours: in the header;\n"
        "  big_vision .npz: [-1, 1]); a file that states none gets inception ([-1, 1]) and the run says so",
    )
    run.add_argument(
        "task",
        nargs="?",
        type=_csv,
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
    run.add_argument("--backbone", type=_csv, help="comma-separated backbones (default: the suite's)")
    _deprecated(run, "-b", type=_csv)
    run.add_argument("--suite", "-s", help="dataset subset and hyper-parameter profile (`transferbench list suites`)")
    run.add_argument("--datasets", "-d", type=_csv, help="comma-separated subset of the suite's datasets")
    run.add_argument("--seeds", type=_ints, help="comma-separated seeds (default: the spec's)")
    run.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a hyper-parameter or sweep, e.g. --set steps=100 --set lr=0.01,0.03 (repeatable)",
    )
    run.add_argument(
        "--out",
        default=Path("runs"),
        type=Path,
        help="records folder (default: runs); each task's results.json (options, versions, the table's rows) "
        "is written beside its records",
    )
    _deprecated(run, "-o", type=Path)
    _execution_options(run)
    run.add_argument("--reference", help="backbone to compare against in the closing table")

    pt = sub.add_parser(
        "pretrain",
        help="pretrain backbones upstream (writes checkpoints for NAME@embedded)",
        formatter_class=fmt,
        description="Run task `pretrain` (DPN App. C, the AugReg recipe; numbers in tasks/pretrain.yaml) for each "
        "backbone into $TRANSFERBENCH_HOME/pretrain. Backbones written NAME@embedded elsewhere resolve to "
        "these checkpoints (and pretrain on demand when one is missing).",
        epilog="examples:\n  transferbench pretrain --backbone mu4,mu4_dpn,mu4_dtn --suite embedded\n"
        "  transferbench run vtab --suite embedded --backbone mu4@embedded,mu4_dpn@embedded",
    )
    pt.add_argument("--backbone", type=_csv, help="comma-separated backbone names (required)")
    _deprecated(pt, "-b", type=_csv)
    pt.add_argument("--suite", "-s", default="embedded", help="pretraining data and profile (default: embedded)")
    pt.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a hyper-parameter; note that it changes the cell, so NAME@embedded will not use it",
    )
    _execution_options(pt)

    data = sub.add_parser("data", help="prepare data: export VTAB to image folders", formatter_class=fmt)
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    ex = data_sub.add_parser(
        "export-vtab",
        formatter_class=fmt,
        help="write VTAB-1k from prepared tfds data as image folders",
        description="Write each VTAB task's train800 / val200 / test (and train800val200) from prepared tfds data "
        "into the image-folder format: PNG (lossless), split lists, sha256 manifest, info.json.",
        epilog="examples:\n  transferbench data export-vtab --data-dir ~/tensorflow_datasets --out ~/vtab-1k\n"
        "  transferbench data export-vtab --tasks cifar100,dtd --out ~/vtab-1k",
    )
    ex.add_argument("--data-dir", help="tfds data dir (default: $TFDS_DATA_DIR, else ~/tensorflow_datasets)")
    ex.add_argument("--out", type=Path, help="folder to write <task>/ into (required)")
    _deprecated(ex, "-o", type=Path)
    ex.add_argument("--tasks", type=_csv, help="comma-separated VTAB tasks (default: all 19)")
    ex.add_argument("--limit", type=int, help="at most this many examples per split (a quick look, not the protocol)")
    ex.add_argument("--no-progress", action="store_true")

    rep = sub.add_parser(
        "report",
        help="tables from records folders",
        formatter_class=fmt,
        description="One table per task: rows are backbones, columns datasets and group means, "
        "cells mean ± 95% CI over seeds. Each backbone is paired with the plain "
        "backbone of the same weights source (mu4_dpn@embedded with mu4@embedded, "
        "random-init mu4_dpn with mu4), or with --reference: paired differences, "
        "significantly better cells in bold, worse in italic, and for the rest the "
        "minimum detectable effect (MDE) of the seeds.",
        epilog="examples:\n  transferbench report runs/ --overview\n"
        "  transferbench report runs/vtab --reference b32\n"
        "  transferbench report runs/ --format csv -o table.csv\n"
        "  transferbench report runs/fewshot --format long -o seeds.csv   # a row per seed\n"
        "  transferbench report runs/vtab --format latex -o vtab.tex      # booktabs",
    )
    rep.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    rep.add_argument(
        "--reference",
        "-r",
        help="compare every backbone with this one (default: the plain backbone of the same weights source)",
    )
    rep.add_argument(
        "--format",
        "-f",
        default="md",
        choices=["md", "csv", "json", "long", "latex"],
        help="md: markdown tables; csv: a row per cell; long: csv with a row per seed and the selected "
        "learning rate (or other `select` value); json: a header (tasks, protocols, references, "
        "date, git sha, versions) and the rows; latex: booktabs tables",
    )
    rep.add_argument(
        "--overview",
        action="store_true",
        help="print the overview instead: every task's headline per backbone against its reference, "
        "then wins / ties / losses (markdown)",
    )
    rep.add_argument(
        "--holm",
        action="store_true",
        help="--overview: judge wins / losses with Holm–Bonferroni over each backbone's comparisons",
    )
    rep.add_argument("--task", "-t", type=_csv, help="only these tasks")
    rep.add_argument("--output", "-o", type=Path, help="write to a file instead of stdout")
    _strict_option(rep)

    lb = sub.add_parser(
        "leaderboard",
        help="write the markdown leaderboard and its figures",
        formatter_class=fmt,
        description="A table of contents, the overview (every task's headline per backbone against "
        "its reference; wins / ties / losses), then the tasks in the DPN paper's order "
        "with their tables, sanity tables (each checkpoint against random init of its "
        "own architecture) and figures (PNG and SVG beside the markdown).",
        epilog="example:\n  transferbench leaderboard runs/vtab runs/fewshot -o results/LEADERBOARD.md",
    )
    lb.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    lb.add_argument(
        "--output",
        "-o",
        type=Path,
        help="the markdown file (default: LEADERBOARD.md in the first DIR; a committed leaderboard is written only "
        "when -o names it)",
    )
    lb.add_argument(
        "--reference",
        "-r",
        help="compare every backbone with this one (default: the plain backbone of the same weights source)",
    )
    lb.add_argument(
        "--holm",
        action="store_true",
        help="judge the overview's wins / losses with Holm–Bonferroni over each backbone's comparisons",
    )
    _strict_option(lb)

    rg = sub.add_parser(
        "regress",
        help="compare two records folders; exit 1 on regression",
        formatter_class=fmt,
        description="Match the cells of --current with those of --baseline on what they are (task, dataset, "
        "backbone, stage, seed, report axes) and gate the change: a setting that differs is a protocol change "
        "and fails unless accepted (--accept); each comparison gets a paired t-test over its seeds (McNemar on "
        "the examples with one seed and --log-samples), each task and backbone a pooled test over all its "
        "datasets and a test of its seed spread, Holm-corrected over the night at --alpha; a test fires when "
        "significant and larger than --floor. Prints a markdown report; exits 1 on a regression, a changed "
        "seed spread or an unaccepted protocol change, 0 otherwise (docs/regression.md).",
        epilog="examples:\n  transferbench regress --baseline nightly/2026-11-22 --current nightly/2026-11-23\n"
        "  transferbench regress --baseline old --current new --accept fewshot:pool   # a changed default, on purpose",
    )
    rg.add_argument("--baseline", required=True, type=Path)
    rg.add_argument("--current", required=True, type=Path)
    _gate_options(rg)
    rg.add_argument("--fail-on-missing", action="store_true", help="also exit 1 when current lacks baseline cells")
    rg.add_argument("--output", "-o", type=Path, help="also write the report to this file")
    _strict_option(rg)

    nt = sub.add_parser(
        "nightly",
        help="run a suite into a dated folder and gate it against a baseline; exit 1 on regression",
        formatter_class=fmt,
        description="The nightly regression run: run each task's --suite into OUT/DATE (resumable: a rerun of the "
        "same date skips finished cells), compare it with the --baseline records as `regress` does, and "
        "write OUT/DATE/REGRESSION.md and OUT/DATE/LEADERBOARD.md. Exits 1 on a regression, a changed seed "
        "spread, an unaccepted protocol change, a failed cell or a baseline cell the run lacks (--allow-missing "
        "to let that pass), 2 on bad input, else 0.",
        epilog="examples:\n  transferbench nightly --baseline results/nightly --out nightly\n"
        "  transferbench nightly --baseline nightly/2026-11-22 --tasks vtab,fewshot --date 2026-11-23\n"
        "  transferbench nightly --baseline runs/main --backbone b32,b32_dpn --data-dir /shared/tfds "
        "--executor ray --address auto",
    )
    nt.add_argument(
        "--baseline",
        required=True,
        type=Path,
        help="records folder to compare against (last night's, or the committed results/nightly)",
    )
    nt.add_argument(
        "--suite",
        "-s",
        default="nightly",
        help="suite of each task (default: nightly, the cheap cells that run every paper default's code path; "
        "docs/regression.md)",
    )
    nt.add_argument(
        "--tasks",
        "-t",
        type=_csv,
        help="comma-separated tasks (default: every task the baseline holds records of for --suite)",
    )
    nt.add_argument("--backbone", type=_csv, help="comma-separated backbones (default: each suite's)")
    _deprecated(nt, "-b", type=_csv)
    nt.add_argument("--seeds", type=_ints, help="comma-separated seeds (default: the suite's)")
    nt.add_argument("--out", type=Path, default=Path("nightly"), help="parent of the dated folders (default: nightly)")
    _deprecated(nt, "-o", type=Path)
    nt.add_argument("--date", help="the dated folder's name (default: today, UTC, YYYY-MM-DD)")
    _gate_options(nt)
    nt.add_argument(
        "--allow-missing", action="store_true", help="pass a night that lacks baseline cells (default: it fails)"
    )
    _execution_options(nt)
    for sp in (run, pt, nt):
        sp.epilog = (sp.epilog or "") + "\n\n" + ENVIRONMENT
    p.run_parser = run  # main() reads --config against run's options
    return p


def cmd_list(args) -> int:
    from tabulate import tabulate

    if args.what == "backbones":
        print(
            tabulate(
                _backbone_rows(),
                [
                    "backbone",
                    "width",
                    "depth",
                    "heads",
                    "patch",
                    "stem",
                    "dtn blocks",
                    "rep_size",
                    "params (M, no head)",
                ],
                tablefmt="github",
            )
        )
        print(
            "\nAlso any timm ViT as timm:MODEL[.TAG][@FILE] (timm.list_models('*vit*')) and your own module as "
            "py:MODULE:FACTORY[@FILE]: docs/backbones.md#bring-your-own-vit"
        )
    elif args.what == "adapters":
        from .adapters import list_adapters

        print("\n".join(list_adapters()) or "no adapters installed")
    else:
        from .spec import installed_specs, load_spec_file

        specs = {n: load_spec_file(p) for n, p in installed_specs().items()}
        if not specs:
            print("no tasks installed")
        elif args.what == "tasks":
            print(
                tabulate(
                    [
                        [
                            n,
                            ", ".join(s.aliases) or "-",
                            s.adapter,
                            len(s.datasets),
                            ", ".join(s.suites) or "-",
                            s.description,
                        ]
                        for n, s in specs.items()
                    ],
                    ["task", "aliases", "adapter", "datasets", "suites", "description"],
                    tablefmt="github",
                )
            )
        else:
            print(
                tabulate(
                    [
                        [n, name, len(suite.datasets or s.datasets), suite.description]
                        for n, s in specs.items()
                        for name, suite in s.suites.items()
                    ],
                    ["task", "suite", "datasets", "description"],
                    tablefmt="github",
                )
            )
    return 0


def _backbone_rows():
    import torch

    from .backbones import create_backbone, list_backbones

    rows = []
    for name in list_backbones():
        with torch.device("meta"):  # shapes only
            m = create_backbone(name)
        cfg = getattr(m, "config", {})
        rows.append(
            [
                name,
                cfg.get("embed_dim"),
                cfg.get("depth"),
                cfg.get("num_heads"),
                cfg.get("patch_size"),
                cfg.get("stem") or "-",
                cfg.get("dtn_layers"),
                cfg.get("rep_size") or "-",
                f"{sum(p.numel() for p in m.parameters()) / 1e6:.1f}",
            ]
        )
    return rows


def _records_folder(out: Path) -> list[Path]:
    """Make --out (and its parents) or say in one line why it cannot be; returns the folders it made,
    so that a run stopped by bad input before any cell can remove them again."""
    made = [p for p in (out, *out.parents) if not p.exists()][::-1]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        _remove_empty(made)
        raise UserError(
            f"--out {out}: cannot write the records folder there ({e.strerror or e}); give a writable folder"
        ) from None
    return made


def _remove_empty(folders: list[Path]) -> None:
    for p in reversed(folders):
        try:
            p.rmdir()
        except OSError:
            pass


def cmd_run(args) -> int:
    if not args.task:
        raise UserError("give a task (`transferbench run vtab`, several as vtab,fewshot) or a --config file with task:")
    if args.probe and not args.dry_run:
        raise UserError("--probe measures this device for --dry-run's estimate: give --dry-run as well")
    code = 0
    for name in args.task:  # each checked in full before its own cells; a later task's bad input stops there
        code = max(code, _dry_run(name, args) if args.dry_run else _run_one(name, args))
    return code


def _dry_run(name: str, args) -> int:
    """The plan of one task and its cost, printed; nothing is run, written or pretrained."""
    from tabulate import tabulate

    from .adapters import prepare_task
    from .backbones.weights import providers, resolve_backbone, split_backbone
    from .cell import BackboneRef
    from .engine.compute import default_device
    from .engine.estimate import full_plan, probe, stages, trained_shapes
    from .records.store import RecordStore

    task = prepare_task(name, suite=args.suite, datasets=args.datasets, seeds=args.seeds, sets=args.sets)
    refs = []
    for spec in _check_backbones(task, args.backbone):
        backbone, weights = split_backbone(spec)
        if weights in providers():  # NAME@embedded may pretrain: not in a dry run (its keys stay unknown)
            refs.append(BackboneRef(spec, backbone, None, f"{weights}-weights-unresolved"))
        else:
            refs.append(resolve_backbone(spec))
    cells = full_plan(task, refs)
    device = args.device or default_device()
    if args.probe:
        for shape in trained_shapes(task, cells):
            print(f"probing {shape[0]} at {shape[1]} px on {device} ...", file=sys.stderr)
            probe(device, *shape)
    store = RecordStore(args.out) if args.out.is_dir() else None
    rows = stages(task, cells, store, device)
    probed = all(not st.unprobed for st in rows)
    table = [[st.name, st.cells, st.finished, f"{st.images:,}", f"{st.hours:,.2f}" if probed else "?"] for st in rows]
    total = sum(st.hours for st in rows)
    table.append(
        [
            "all",
            sum(st.cells for st in rows),
            sum(st.finished for st in rows),
            f"{sum(st.images for st in rows):,}",
            f"{total:,.2f}" if probed else "?",
        ]
    )
    print(
        f"### {task.name} — suite {task.suite or 'all'}, {len(task.datasets)} datasets, seeds "
        f"{','.join(map(str, task.seeds))}, backbones {', '.join(r.spec for r in refs)} (dry run)\n"
    )
    print(
        tabulate(
            table,
            ["stage", "cells", f"with records in {args.out}", "training images", f"device-hours ({device})"],
            tablefmt="github",
        )
    )
    missing = sorted({shape for st in rows for shape in st.unprobed})
    if missing:
        print(
            f"\nno estimate: {', '.join(f'{n} at {r} px' for n, r in missing)} not probed on {device}; add --probe "
            "(a few training steps of each, cached)"
        )
    else:
        print(
            "\ndevice-hours: training steps only, at the probed rate per image (evaluation and data loading not "
            "counted; on a GPU a larger batch is usually faster per image, so this is an upper bound)"
        )
    return 0


def _run_one(name: str, args) -> int:
    from .adapters import prepare_task
    from .records.store import RESULTS_FILE, load_records
    from .reporting.tables import render, report_tables

    # the checks that cost nothing come first, then the data, then pretraining (NAME@embedded) and cells
    task = prepare_task(name, suite=args.suite, datasets=args.datasets, seeds=args.seeds, sets=args.sets)
    names = _check_backbones(task, args.backbone)
    if args.reference and args.reference not in names:
        raise UserError(f"--reference {args.reference!r} is not among --backbone {','.join(names)}")
    executor = _check_execution_options(args)
    backbones, made = _prepare(task, names, args.out, args)
    summary = _run(task, backbones, args.out, args, executor, made)
    records = (
        [r for r in load_records([args.out / task.name]) if r["backbone"] in names]
        if (args.out / task.name).is_dir()
        else []
    )
    if records:
        tables = report_tables(records, reference=args.reference)
        print(render(tables))
        _write_results(args.out / task.name / RESULTS_FILE, task, args, summary, records, tables)
    return 1 if summary.failed else 0


def run_config(args) -> dict:
    """run's resolved options as plain JSON values: stored in each record and in results.json."""
    skip = {"command", "config", "verbose", "quiet"}
    return {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in sorted(vars(args).items())
        if k not in skip and not k.startswith("_")
    }


def _write_results(path: Path, task, args, summary, records: list, tables: list) -> None:
    """lm-eval's results file: what ran (options, versions), what happened (the run's counts) and the table's rows,
    beside the records; rewritten by each run of the task into this folder."""
    import json

    from .engine.runner import environment
    from .paths import atomic_path
    from .reporting.tables import render, report_header

    body = {
        "task": task.name,
        "suite": task.suite,
        "protocol_version": task.spec.protocol_version,
        "config": run_config(args),
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


def _check_backbones(task, given: list[str] | None) -> list[str]:
    """--backbone, else the suite's backbones, each checked by what costs nothing (name, checkpoint header)."""
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


def _prepare(task, names: list[str], out: Path, args) -> tuple[list, list[Path]]:
    """Make --out and check the data (removing the folders it made when either fails), then resolve the checked
    backbones `names` (NAME@embedded may pretrain); returns their cell.BackboneRefs and the folders made."""
    from .adapters import resolve_backbone
    from .engine.runner import CellContext
    from .paths import check_home, clean_home

    check_home()  # before anything is generated or cached there
    clean_home()
    made = _records_folder(out)
    try:
        if hasattr(task.adapter, "check_data"):
            task.adapter.check_data(task, CellContext("cpu", data_dir=args.data_dir))
        return [resolve_backbone(b) for b in names], made
    except UserError:
        _remove_empty(made)
        raise


def _run(task, backbones: list, out: Path, args, executor, made: list[Path]):
    """Run every cell of `task` for `backbones` into `out` with `executor`; prints and returns the summary. When
    the executor cannot start (no Ray cluster there), the folders `made` for this run go again, being empty."""
    from .engine.runner import run_task

    how = (
        ""
        if args.executor == "local" and args.jobs == 1
        else f" ({args.executor} executor{f', {args.jobs} jobs' if args.executor == 'local' else ''})"
    )
    print(
        f"{task.name}: suite {task.suite or 'all'}, {len(task.datasets)} datasets, seeds "
        f"{','.join(map(str, task.seeds))}, {len(backbones)} backbones -> {out}{how}",
        file=sys.stderr,
    )
    try:
        summary = run_task(
            task,
            backbones,
            out,
            force=args.force,
            device=args.device,
            data_dir=args.data_dir,
            workers=args.workers,
            micro_batch=args.micro_batch,
            show_progress=not args.no_progress,
            executor=executor,
            retries=args.retries,
            check_data=False,
            log_samples=getattr(args, "log_samples", False),
            config=run_config(args),
            compile=args.compile,
            stale=args.stale or "stop",
        )
    except UserError:
        _remove_empty(made)
        raise
    print(f"{task.name}: {summary.line()}", file=sys.stderr)
    for f in summary.failures:
        print(f"  failed: {f}", file=sys.stderr)
    return summary


def cmd_pretrain(args) -> int:
    from .paths import cache

    if not args.backbone:
        raise UserError("give --backbone (e.g. --backbone mu4,mu4_dpn,mu4_dtn)")
    args.task, args.datasets, args.seeds, args.reference = ["pretrain"], None, None, None
    args.dry_run = args.probe = False  # `run pretrain` plans and estimates; this command trains
    args.out = cache("pretrain")
    args.stale = args.stale or "recompute"  # a cache: a pretraining of other code is done again unless kept
    return cmd_run(args)


def cmd_data(args) -> int:
    from tqdm.auto import tqdm

    if args.out is None:
        raise UserError("give --out, the folder to write the VTAB tasks into")

    from .data.vtab import export_vtab, task

    for name in args.tasks or []:
        task(name)  # unknown names fail before any work, with close matches
    progress = None if args.no_progress else (lambda it, **kw: tqdm(it, leave=False, **kw))
    for path in export_vtab(args.out, args.tasks, data_dir=args.data_dir, limit=args.limit, progress=progress):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_report(args) -> int:
    from .records.store import load_records
    from .reporting.tables import check_reference, render, report_header, report_tables

    records = load_records(args.dirs, strict=args.strict)
    if args.task:
        records = [r for r in records if r["task"] in args.task]
    if not records:
        raise UserError(f"no records under {', '.join(map(str, args.dirs))} (run `transferbench run` first)")
    check_reference(args.reference, {r["backbone"] for r in records}, "these records")
    failed = sum(r["status"] == "failed" for r in records)
    if failed:
        print(
            f"note: {failed} failed cells have no metric and are not in the tables (a rerun of the same "
            "`transferbench run` retries them)",
            file=sys.stderr,
        )
    if args.overview:
        if args.format != "md":
            raise UserError("--overview prints markdown; drop --format or drop --overview")
        from .reporting.leaderboard import overview

        text = "\n".join(overview(records, args.reference, correct=args.holm))
    else:
        # md, latex: one table per report-axis setting (few-shot shots), headline first; the rest: the wide form
        tables = report_tables(records, reference=args.reference, split_axes=args.format in ("md", "latex"))
        text = render(tables, args.format, header=report_header(records, tables))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0


def cmd_leaderboard(args) -> int:
    from .engine.runner import environment
    from .reporting.leaderboard import write_leaderboard

    out = write_leaderboard(
        args.dirs,
        args.output or args.dirs[0] / "LEADERBOARD.md",  # a committed leaderboard only when -o names it
        reference=args.reference,
        git_sha=environment()["git_sha"],
        correct=args.holm,
        strict=args.strict,
    )
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _gate_options(p) -> None:
    from .reporting.regress import ALPHA, FLOOR

    p.add_argument(
        "--floor",
        "--threshold",
        dest="floor",
        type=float,
        default=FLOOR,
        help=f"smallest change of one comparison that counts, in metric units ({FLOOR}; half of it for a pooled mean)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=ALPHA,
        help=f"family-wise error rate of the tests of one run of the gate, Holm-corrected ({ALPHA})",
    )
    p.add_argument(
        "--accept",
        type=_csv,
        default=[],
        metavar="TASK[:SETTING]",
        help="protocol changes made on purpose: TASK (every setting of it), TASK:SETTING or :SETTING "
        "(e.g. fewshot:pool, vtab:protocol_version)",
    )


def _check_gate_options(args) -> None:
    if not 0 < args.alpha < 1:
        raise UserError(f"--alpha {args.alpha}: give a family-wise error rate between 0 and 1, e.g. 0.01")
    if args.floor < 0:
        raise UserError(f"--floor {args.floor}: give a change in metric units, 0 or more, e.g. 0.5")


def cmd_regress(args) -> int:
    from .records.store import load_records
    from .reporting.regress import verdict

    _check_gate_options(args)
    text, code = verdict(
        load_records([args.baseline], strict=args.strict),
        load_records([args.current], strict=args.strict),
        args.floor,
        alpha=args.alpha,
        accept=args.accept,
        fail_on_missing=args.fail_on_missing,
    )
    print(text)
    if args.output:
        args.output.write_text(text)
    return code


def cmd_nightly(args) -> int:
    from datetime import datetime, timezone

    from .adapters import prepare_task
    from .engine.runner import environment
    from .records.store import load_records
    from .reporting.leaderboard import write_leaderboard
    from .reporting.regress import verdict

    executor = _check_execution_options(args)
    _check_gate_options(args)
    date = args.date or datetime.now(timezone.utc).strftime("%Y-%m-%d")
    if not date or "/" in date or date.startswith("."):
        raise UserError(f"--date {date!r}: give a plain folder name such as 2026-11-23")
    baseline = [r for r in load_records([args.baseline]) if (r.get("suite") or "") == args.suite]
    names = args.tasks or sorted({r["task"] for r in baseline})
    if not names:
        raise UserError(
            f"--baseline {args.baseline} holds no records of suite {args.suite!r}: give a records folder "
            f"of a `transferbench run TASK --suite {args.suite}` (or --tasks to run without a baseline)"
        )
    # every task, suite, backbone and data set is checked before the first cell runs
    tasks = [prepare_task(t, suite=args.suite, seeds=args.seeds) for t in names]
    current = args.out / date
    backbones = {t.name: _check_backbones(t, args.backbone) for t in tasks}
    resolved = {t.name: _prepare(t, backbones[t.name], current, args) for t in tasks}
    for task in tasks:
        refs, made = resolved[task.name]
        _run(task, refs, current, args, executor, made)
    ran = {(t.spec.task, b) for t in tasks for b in backbones[t.name]}
    text, code = verdict(
        [r for r in baseline if (r["task"], r["backbone"]) in ran],
        load_records([current]),
        args.floor,
        alpha=args.alpha,
        accept=args.accept,
        fail_on_missing=not args.allow_missing,
        fail_on_failed=True,
        title=f"Nightly {date}: {current} vs {args.baseline}",
    )
    (current / "REGRESSION.md").write_text(text)
    board = write_leaderboard([current], current / "LEADERBOARD.md", git_sha=environment()["git_sha"])
    print(text)
    print(f"wrote {current / 'REGRESSION.md'} and {board}", file=sys.stderr)
    return code


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


def _with_config(parser, argv, args):
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
        defaults[dest] = _config_value(actions[dest], value, key, args.config)
    run.set_defaults(**defaults)
    return parser.parse_args(argv)


def _config_value(action, value, key, source):
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
        if action.type in (_csv, _ints) and isinstance(value, list):
            return action.type(",".join(map(str, value)))
        return action.type(str(value)) if action.type else value
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise UserError(f"--config {source}: {key}: {e}") from None


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "config", None):
            args = _with_config(parser, argv if argv is not None else sys.argv[1:], args)
        _apply_deprecated(args)
        _verbosity(args)
        code = {
            "list": cmd_list,
            "run": cmd_run,
            "pretrain": cmd_pretrain,
            "data": cmd_data,
            "report": cmd_report,
            "leaderboard": cmd_leaderboard,
            "regress": cmd_regress,
            "nightly": cmd_nightly,
        }[args.command](args)
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
        print("transferbench: interrupted; finished cells are saved, rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
