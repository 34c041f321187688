"""`transferbench report` (tables from records folders) and `transferbench leaderboard` (the markdown leaderboard
and its figures)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UserError
from .options import check_output, csv_list, output_option, reference_option, strict_option, subcommand

REPORT_HELP = """\
tables from records folders

One table per task: rows are backbones, columns datasets and group means, cells mean ± 95% CI over seeds. Each
backbone is paired with the plain backbone of the same weights source (mu4_dpn@embedded with mu4@embedded,
random-init mu4_dpn with mu4), or with --reference: paired differences, significantly better cells in bold, worse in
italic, and for the rest the minimum detectable effect (MDE) of the seeds.

examples:
  transferbench report runs/ --overview
  transferbench report runs/vtab --reference b32
  transferbench report runs/ --format csv -o table.csv
  transferbench report runs/fewshot --format long -o seeds.csv   # a row per seed
  transferbench report runs/vtab --format latex -o vtab.tex      # booktabs
"""


def add_parsers(sub) -> None:
    rep = subcommand(sub, "report", REPORT_HELP)
    rep.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    reference_option(rep)
    rep.add_argument(
        "--format",
        "-f",
        default="md",
        choices=["md", "csv", "json", "long", "latex"],
        help="md: markdown tables, then each task's runs beside the published numbers they match "
        "(`transferbench list references`); csv: a row per cell; long: csv with a row per seed and the selected "
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
    rep.add_argument("--task", "-t", type=csv_list, help="only these tasks")
    output_option(rep, "write to a file instead of stdout")
    strict_option(rep)
    _leaderboard_parser(sub)


LEADERBOARD_HELP = """\
write the markdown leaderboard and its figures

A table of contents, the overview (every task's headline per backbone against its reference; wins / ties / losses),
then the tasks in the DPN paper's order with their tables, sanity tables (each checkpoint against random init of its
own architecture) and figures (PNG and SVG beside the markdown).

example:
  transferbench leaderboard runs/vtab runs/fewshot -o results/LEADERBOARD.md
"""


def _leaderboard_parser(sub) -> None:
    lb = subcommand(sub, "leaderboard", LEADERBOARD_HELP)
    lb.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    output_option(
        lb,
        "the markdown file (default: LEADERBOARD.md in the first DIR; a committed leaderboard is written only "
        "when -o names it)",
    )
    reference_option(lb)
    lb.add_argument(
        "--holm",
        action="store_true",
        help="judge the overview's wins / losses with Holm–Bonferroni over each backbone's comparisons",
    )
    strict_option(lb)


def report(args) -> int:
    from ..records.store import load_records
    from ..reporting.formats import render
    from ..reporting.kinds import report_tables
    from ..reporting.provenance import report_header
    from ..reporting.tables import check_reference

    if args.output:
        check_output(args.output)
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
        from ..reporting.leaderboard import overview

        text = "\n".join(overview(records, args.reference, correct=args.holm))
    else:
        # md, latex: one table per report-axis setting (few-shot shots), headline first; the rest: the wide form
        tables = report_tables(records, reference=args.reference, split_axes=args.format in ("md", "latex"))
        text = render(tables, args.format, header=report_header(records, tables))
        if args.format == "md":  # each task's runs beside the published numbers they match (reporting.versus)
            from ..reporting.versus import versus_markdown

            for task in dict.fromkeys(r["task"] for r in records):
                text += "\n\n" + "\n".join(
                    versus_markdown(task, records, heading=f"### Against the published numbers ({task})")
                )
    if args.output:
        args.output.write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0


def leaderboard(args) -> int:
    from ..engine.compute import environment
    from ..reporting.leaderboard import write_leaderboard

    out = args.output or args.dirs[0] / "LEADERBOARD.md"  # a committed leaderboard only when -o names it
    if args.output or args.dirs[0].is_dir():  # a missing DIR is the records' error, said when they are read
        check_output(out)  # the markdown and its figures beside it: writable, before the work
    out = write_leaderboard(
        args.dirs,
        out,
        reference=args.reference,
        git_sha=environment()["git_sha"],
        correct=args.holm,
        strict=args.strict,
    )
    print(f"wrote {out}", file=sys.stderr)
    return 0
