"""`transferbench regress` (compare two records folders and gate the change) and `transferbench nightly` (run the
nightly suite into a dated folder and gate it against a baseline)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ..errors import UserError
from .options import (
    backbone_option,
    check_execution_options,
    check_output,
    csv_list,
    deprecated,
    execution_options,
    output_option,
    patterns_option,
    seeds_option,
    strict_option,
    subcommand,
    tracking_options,
)


def add_parsers(sub) -> argparse.ArgumentParser:
    """The regress, nightly and reanchor parsers; returns nightly's."""
    _regress_parser(sub)
    nightly_parser = _nightly_parser(sub)
    _reanchor_parser(sub)
    _accept_parser(sub)
    return nightly_parser


ACCEPT_HELP = """\
declare a change that moves the nightly's numbers on purpose, in the anchor's ledger

Append an entry to the acceptance ledger beside the anchor (ANCHOR/ACCEPTED.yaml): modules at their current code
fingerprint (--code), or settings at their new value (--protocol), and why. `nightly` and `regress` then pass the
cells whose outputs changed only in those modules, at exactly those fingerprints: a later change of the same module
has another fingerprint and fails, against the anchor and any rolling baseline. Run it in the commit that makes the
change; `reanchor` empties the ledger.

examples:
  transferbench accept --code backbones.dtn --why "DTN's backward as one Gram product"
  transferbench accept --protocol fewshot:pool=tok --why "the paper pools the class token"
"""


def _accept_parser(sub) -> None:
    ac = subcommand(sub, "accept", ACCEPT_HELP)
    ac.add_argument(
        "--code", type=csv_list, default=[], metavar="MODULE", help="modules (a package: each module in it)"
    )
    ac.add_argument(
        "--protocol", action="append", default=[], metavar="TASK:SETTING=VALUE", help="a setting at its new value"
    )
    ac.add_argument("--why", required=True, help="why the change is meant (one line)")
    ac.add_argument(
        "--anchor",
        type=Path,
        default=Path("results/nightly"),
        help="the anchor whose ledger (default: results/nightly)",
    )


def accept(args) -> int:
    from ..gate import ledger

    if not args.anchor.is_dir():
        raise UserError(f"--anchor {args.anchor}: not a records folder (give the anchor, e.g. results/nightly)")
    written = ledger.add(args.anchor, args.code, args.protocol, args.why)
    print(f"added to {args.anchor / ledger.LEDGER}:\n{written}", end="")
    return 0


REANCHOR_HELP = """\
regenerate the nightly's anchor from this commit; compare, and empty its ledger

Regenerate the anchor (the committed results/nightly) from the code of this clean checkout: run its tasks' --suite
here (each `bf16: auto` step pinned to the old anchor's choice), write the comparison of the old anchor with the new
one to ANCHOR/REANCHOR.md (exact where both were computed in this arithmetic, with the ledger's entries marked
accepted), replace the old records and empty the acceptance ledger ANCHOR/ACCEPTED.yaml. Commit the folder: every
later night rebuilds the anchor from the commit its records name. Exit 2 on a checkout with uncommitted changes (a
later night could not rebuild that code).

examples:
  transferbench reanchor --anchor results/nightly --jobs 2
  git add results/nightly && git commit -m 'Re-anchor the nightly'
"""


def _reanchor_parser(sub) -> None:
    ra = subcommand(sub, "reanchor", REANCHOR_HELP)
    ra.add_argument(
        "--anchor", type=Path, default=Path("results/nightly"), help="the anchor (default: results/nightly)"
    )
    ra.add_argument("--suite", "-s", default="nightly", help="suite of each task (default: nightly)")
    ra.add_argument("--tasks", "-t", type=csv_list, help="comma-separated tasks (default: every task the anchor holds)")
    backbone_option(ra, "comma-separated backbones (default: each suite's)")
    gate_options(ra)
    execution_options(ra)


REGRESS_HELP = """\
compare two records folders; exit 1 on regression

Match the cells of --current with those of --baseline on what they are (task, dataset, backbone, stage, seed, report
axes) and gate the change. Cells that both sides computed in the same arithmetic (the records' arithmetic digest:
kernels, threads, libraries, precision) are judged to the bit: equal outputs pass, outputs changed by code fail
naming the modules (--accept-code accepts them), outputs changed with nothing else changed are irreproducible and
fail. The other cells are judged statistically: a setting that differs is a protocol change and fails unless
accepted (--accept); each comparison gets a paired t-test over its seeds (McNemar on the examples with one seed and
--log-samples), each task and backbone a pooled test over all its datasets and a test of its seed spread,
Holm-corrected over the night at --alpha; a test fires when significant and larger than --floor. Prints a markdown
report; exits 1 on a regression, an improvement (unless --allow-improvement), a consistent shift, a changed seed
spread, a non-finite value, an unaccepted protocol change, a failed or diverged cell, missing cells or metrics,
nothing compared, or a task or backbone of the baseline absent from current (--allow-missing names those that may
be), 0 otherwise; 2 on an empty or unreadable folder (docs/regression.md).

examples:
  transferbench regress --baseline nightly/2026-11-22 --current nightly/2026-11-23
  transferbench regress --baseline old --current new --accept fewshot:pool   # a changed default, on purpose
  transferbench regress --baseline old --current new --accept-code backbones.dtn   # a meant numeric change
"""


def _regress_parser(sub) -> None:
    rg = subcommand(sub, "regress", REGRESS_HELP)
    rg.add_argument("--baseline", required=True, type=Path)
    rg.add_argument("--current", required=True, type=Path)
    rg.add_argument(
        "--ledger",
        type=Path,
        help="the acceptance ledger to honour (default: ACCEPTED.yaml in --baseline, where there is one): each "
        "entry accepts the modules and settings it names for a baseline computed before its commit",
    )
    gate_options(rg)
    rg.add_argument(
        "--fail-on-missing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="exit 1 when current lacks baseline cells (a dropped seed), or a split or metric of them (a renamed "
        "metric), or kept them from other code (--stale keep), as `nightly` does (default); --no-fail-on-missing "
        "passes them, listed",
    )
    allow_missing_option(rg)
    output_option(rg, "also write the report to this file")
    strict_option(rg)


NIGHTLY_HELP = """\
run a suite into a dated folder and gate it against a baseline; exit 1 on regression

The nightly regression run: run each task's --suite into OUT/DATE (resumable: a rerun of the same date skips
finished cells), compare it with the --baseline records as `regress` does, and write OUT/DATE/REGRESSION.md and
OUT/DATE/LEADERBOARD.md. Exits 1 on a regression, a changed seed spread, an unaccepted protocol change, a failed
cell or a baseline cell the run lacks (--allow-missing to let that pass), 2 on bad input, else 0.

examples:
  transferbench nightly --baseline results/nightly --out nightly
  transferbench nightly --baseline nightly/2026-11-22 --tasks vtab,fewshot --date 2026-11-23
  transferbench nightly --baseline runs/main --backbone b32,b32_dpn --data-dir /shared/tfds \\
      --executor ray --address auto
"""


def _nightly_parser(sub) -> argparse.ArgumentParser:
    nt = subcommand(sub, "nightly", NIGHTLY_HELP)
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
        type=csv_list,
        help="comma-separated tasks (default: every task the baseline holds records of for --suite)",
    )
    backbone_option(nt, "comma-separated backbones (default: each suite's)")
    seeds_option(nt, "comma-separated seeds (default: the suite's)")
    nt.add_argument("--out", type=Path, default=Path("nightly"), help="parent of the dated folders (default: nightly)")
    deprecated(nt, "-o", type=Path)
    nt.add_argument("--date", help="the dated folder's name (default: today, UTC, YYYY-MM-DD)")
    gate_options(nt)
    allow_missing_option(nt)
    nt.add_argument(
        "--rolling",
        type=Path,
        help="folder of rolling baselines, one per arithmetic (ROLLING/<digest>): the night is gated, exact tier "
        "first, against the last passing night of the same arithmetic, and statistically against --baseline as a "
        "fixed anchor; a passing night replaces its rolling baseline. A runner kind without one is gated against "
        "the anchor alone",
    )
    nt.add_argument(
        "--no-rebuild",
        action="store_true",
        help="where the --baseline records were computed in other arithmetic (another CPU, threads, libraries), "
        "judge statistically instead of rebuilding them on this runner (by default the nightly checks out the "
        "commit they name in a git worktree, reruns the suite there once, caches it per arithmetic, and judges "
        "tonight exactly against it)",
    )
    execution_options(nt)
    tracking_options(nt)
    return nt


def allow_missing_option(p) -> None:
    patterns_option(
        p,
        "--allow-missing",
        "TASK[:BACKBONE],...",
        help="pass although current lacks these tasks or backbones of the baseline (alone: any task or backbone). "
        "Inside a task that ran, a missing cell (a dropped seed, a cell kept from other code) passes only where named "
        "as cells:TASK[:BACKBONE], and a vanished metric as metric:TASK:METRIC. By default each of them fails",
    )


def regress(args) -> int:
    from ..gate import ledger
    from ..gate.decide import decide
    from ..records.store import check_folder, load_records
    from ..reporting.regress import decision_text

    check_gate_options(args)
    for flag, folder in (("--baseline", args.baseline), ("--current", args.current)):
        if folder.exists():  # a missing one is the records' error, said when they are read
            check_folder(folder, flag)  # before the ledger beside --baseline is read
    if args.output:
        check_output(args.output)
    if args.ledger is not None and not args.ledger.is_file():
        raise UserError(f"--ledger {args.ledger}: no such file (give an ACCEPTED.yaml, or leave --ledger out)")
    book = ledger.load(args.ledger or args.baseline)
    baseline = load_records([args.baseline], strict=args.strict)
    accept, accept_code, lines = book.accepts()
    options = dataclasses.replace(
        gate_settings(args).accepting(accept, accept_code),  # the flags', then the ledger's acceptances
        fail_on_missing=args.fail_on_missing,
        allow_missing=args.allow_missing,
    )
    decision = decide(baseline, load_records([args.current], strict=args.strict), options)
    text, code = decision_text(decision), decision.code
    unused = book.unused(decision.gate)
    if unused:
        lines += ["- matching nothing in this comparison:", *(f"  {x}" for x in unused)]
    if lines:
        text += f"\n\nAcceptance ledger entries honoured ({book.path}):\n\n" + "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return code


def gate_settings(args):
    """The gate's options (gate.decide.GateOptions) from the flags of `regress`, `nightly` and `reanchor`: built once
    here and handed down whole."""
    from ..gate.decide import GateOptions, noise_model_at

    return GateOptions(
        floor=args.floor,
        alpha=args.alpha,
        accept=tuple(args.accept or ()),
        accept_code=tuple(args.accept_code or ()),
        allow_improvement=args.allow_improvement or (),
        allow_untested=args.allow_untested,
        noise=noise_model_at(args.noise_model),
    )


def nightly(args) -> int:
    from datetime import datetime, timezone

    from ..night import Night
    from .tracked import log_folder

    options, executor = check_execution_options(args)
    check_gate_options(args)
    night = Night(
        args.baseline,
        args.out,
        args.date or datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        suite=args.suite,
        tasks=args.tasks,
        backbones=args.backbone,
        seeds=args.seeds,
        gate=gate_settings(args),
        allow_missing=args.allow_missing,
        rolling=args.rolling,
        rebuild=not args.no_rebuild,
    )
    if options.tracking is not None:  # each night's entries in a folder of its own: LOG_DIR/DATE
        options = dataclasses.replace(
            options, tracking=dataclasses.replace(options.tracking, dir=options.tracking.dir / night.date)
        )
    text, code = night.run(options, executor)
    log_folder(options.tracking, night.current, night.suite, night.figures, trackers=options.trackers)
    print(text)
    return code


def reanchor(args) -> int:
    from ..night import reanchor as make

    options, executor = check_execution_options(args)
    check_gate_options(args)
    text = make(
        args.anchor,
        suite=args.suite,
        tasks=args.tasks,
        backbones=args.backbone,
        gate=gate_settings(args),
        options=options,
        executor=executor,
    )
    print(text)
    return 0


def gate_options(p) -> None:
    from ..gate.comparisons import ALPHA, FLOOR

    patterns_option(
        p,
        "--allow-improvement",
        "TASK[:BACKBONE[:METRIC]],...",
        help="pass a significant improvement where named (alone: anywhere). By default it fails: numbers that move "
        "without a declared change are a change of the code or the data, whichever way they move",
    )
    p.add_argument(
        "--allow-untested",
        action="store_true",
        help="pass comparisons no test can judge (a task, split, metric or kind of difference the noise model does "
        "not cover; one seed of other weights without logged examples). By default each fails the night, listed",
    )
    p.add_argument(
        "--noise-model",
        type=Path,
        metavar="FILE",
        help="the statistical tier's null across arithmetic: a noise model measured by `python -m "
        "benchmarks.noise_model` on the baseline's code (default: the package's, measured on the anchor's code; "
        "refused where the baseline was computed by other code)",
    )
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
        type=csv_list,
        default=[],
        metavar="TASK[:SETTING]",
        help="protocol changes made on purpose: TASK (every setting of it), TASK:SETTING or :SETTING "
        "(e.g. fewshot:pool, vtab:protocol_version)",
    )
    p.add_argument(
        "--accept-code",
        type=csv_list,
        default=[],
        metavar="MODULE",
        help="code changes meant to move numbers, for this run only: a module (backbones.vit or "
        "transferbench.backbones.vit) or a package (every module under it). A cell computed in the same arithmetic "
        "from the same weights and data on both sides whose outputs changed passes when every module that changed "
        "in its fingerprint is accepted; the report lists it as accepted",
    )


def check_gate_options(args) -> None:
    if not 0 < args.alpha < 1:
        raise UserError(f"--alpha {args.alpha}: give a family-wise error rate between 0 and 1, e.g. 0.01")
    if args.floor < 0:
        raise UserError(f"--floor {args.floor}: give a change in metric units, 0 or more, e.g. 0.5")
    if getattr(args, "noise_model", None) is not None and not args.noise_model.is_file():
        raise UserError(
            f"--noise-model {args.noise_model}: no such file (measure one: python -m benchmarks.noise_model --work W "
            "--out FILE)"
        )
