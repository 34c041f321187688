"""Regenerate the committed results, timing each step alone on this machine: `python -m benchmarks.regenerate`.

The committed numbers are made by one commit, in this order (each phase its own invocation, since the weights
that the first phase writes must be committed before the records that use them are made):

    python -m benchmarks.regenerate pretrain     # the three shipped checkpoints, then `git commit` them
    python -m benchmarks.regenerate runs         # the seven embedded suites into results/runs
    python -m benchmarks.regenerate nightly      # the gate's baseline, into results/nightly
    python -m benchmarks.regenerate report       # results/LEADERBOARD.md and its figures

`pretrain` trains mu4, mu4_dpn and mu4_dtn one after another, each alone on every core, with the embedded
pretraining profile (`transferbench pretrain --backbone B`), and copies each checkpoint, its training log and its
digest into transferbench/weights under the name `NAME@embedded` looks for, removing the files they replace.
`runs` and `nightly` refuse a tree with uncommitted changes (every record names the commit that made it) and an
output folder that already holds a task's records (move it aside or `git rm -r` it first: nothing is overwritten). Every
phase works in a fresh, empty `$TRANSFERBENCH_HOME` (`--home`, default a new temporary folder), so data
generation and feature caches are part of the time, as for a newcomer. `runs` runs `vtab` first, as the README's
main command does (`transferbench run vtab --suite embedded --jobs 2`).

Each step's wall time is printed as it finishes and the table is written to `--times` (default
`regenerate-<phase>.md`): the figures the budgets of the embedded world are held to.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("mu4", "mu4_dpn", "mu4_dtn")
SUITES = ("vtab", "fewshot", "ade20k", "lit", "imagenet_c", "hires", "diagnose")  # vtab first: the main command
NIGHTLY = ("pretrain", *SUITES)


def fail(message: str) -> None:
    print(f"regenerate: {message}", file=sys.stderr)
    raise SystemExit(2)


def clean_tree() -> None:
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    if dirty.returncode != 0:
        fail(f"not a git checkout ({ROOT}): the records must name the commit that made them")
    if dirty.stdout.strip():
        first = dirty.stdout.splitlines()[0]
        fail(f"uncommitted changes ({first.strip()} ...): commit them, so the records name the code that made them")


def empty_folder(path: Path, what: str) -> None:
    if path.exists() and any(path.iterdir()):
        fail(f"{path} already holds {what}: move it aside or `git rm -r` it first (nothing is overwritten)")


def timed(argv: list[str], env: dict, log) -> float:
    """Run one command to the end, its output to the terminal and the log file; its wall seconds."""
    print("$ " + " ".join(argv), flush=True)
    log.write("$ " + " ".join(argv) + "\n")
    log.flush()
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        sys.stdout.write(line)
        log.write(line)
    seconds = time.monotonic() - start
    if proc.wait() != 0:
        log.flush()
        fail(f"`{' '.join(argv)}` exited {proc.returncode} after {seconds:.0f} s; its output is in {log.name}")
    return seconds


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(round(seconds % 60)):02d} s"


def ship(home: Path, backbone: str) -> Path:
    """Copy the checkpoint that `transferbench pretrain --backbone B` left under `home`, with its training log, to
    where `NAME@embedded` looks for it in transferbench/weights, write its digest, and remove the files of
    `backbone` it replaces."""
    from transferbench.adapters.pretrain import SHIPPED as WEIGHTS
    from transferbench.adapters.pretrain import shipped_checkpoint
    from transferbench.paths.entries import write_digest

    os.environ["TRANSFERBENCH_HOME"] = str(home)
    made = sorted((home / "checkpoints").glob(f"{backbone}-upstream-*.safetensors"))
    if len(made) != 1:
        fail(f"expected one checkpoint of {backbone} under {home / 'checkpoints'}, found {len(made)}")
    src, dst = made[0], shipped_checkpoint(backbone)
    for old in WEIGHTS.glob(f"{backbone}-upstream-*"):
        old.unlink()
    shutil.copyfile(src, dst)
    log = src.with_name(src.stem + ".log.json")
    if log.is_file():
        shutil.copyfile(log, dst.with_name(dst.stem + ".log.json"))
    write_digest(dst)
    return dst


def check_shipped() -> None:
    """Every shipped checkpoint matches the current pretraining profile: otherwise `NAME@embedded` would pretrain
    on demand inside the runs, and their times and weights would not be the committed ones."""
    from transferbench.adapters.pretrain import shipped_checkpoint

    for b in SHIPPED:
        path = shipped_checkpoint(b)
        if not path.is_file():
            fail(
                f"no shipped checkpoint of {b} for the current pretraining profile ({path.name}): run "
                "`python -m benchmarks.regenerate pretrain` and commit transferbench/weights first"
            )


def _home(given: Path | None) -> Path:
    """The home the phase runs in: `given`, which must be empty (a fresh home is part of what is timed), else a new
    temporary folder."""
    if given is None:
        return Path(tempfile.mkdtemp(prefix="transferbench-home-"))
    empty_folder(given, "files (a fresh home is part of what is timed)")
    given.mkdir(parents=True, exist_ok=True)
    return given


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.regenerate",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("phase", choices=("pretrain", "runs", "nightly", "report"))
    p.add_argument("--home", type=Path, help="an empty TRANSFERBENCH_HOME (default: a new temporary folder)")
    p.add_argument("--jobs", type=int, default=2, help="cells at a time for `runs` and `nightly` (2)")
    p.add_argument("--times", type=Path, help="where the table of times goes (regenerate-<phase>.md)")
    p.add_argument("--only", help="comma-separated backbones (pretrain) or tasks (runs, nightly): a part of the phase")
    args = p.parse_args(argv)

    exe = shutil.which("transferbench")
    if exe is None:
        fail("the `transferbench` command is not on PATH: install the checkout first (pip install -e .)")
    tb = [exe]
    known = {"pretrain": SHIPPED, "runs": SUITES, "nightly": NIGHTLY, "report": ()}[args.phase]
    names = args.only.split(",") if args.only else list(known)
    for n in names:
        if n not in known:
            fail(f"--only names {n!r}, not one of {', '.join(known)}")
    out = ROOT / "results" / ("nightly" if args.phase == "nightly" else "runs")
    if args.phase in ("runs", "nightly"):
        clean_tree()
        check_shipped()
        for t in names:
            empty_folder(out / t, "records")
    home = _home(args.home)
    env = {**os.environ, "TRANSFERBENCH_HOME": str(home)}
    times_path = args.times or Path(f"regenerate-{args.phase}.md")
    rows: list[tuple[str, float]] = []

    with open(times_path.with_suffix(".log"), "w") as log:
        if args.phase == "pretrain":
            for b in names:
                seconds = timed([*tb, "pretrain", "--backbone", b, "--no-progress"], env, log)
                dst = ship(home, b)
                rows.append((f"`transferbench pretrain --backbone {b}` -> {dst.name}", seconds))
                print(f"{b}: {minutes(seconds)}", flush=True)
        elif args.phase in ("runs", "nightly"):
            suite = "embedded" if args.phase == "runs" else "nightly"
            for t in names:
                cmd = [*tb, "run", t, "--suite", suite, "--out", str(out.relative_to(ROOT)), "--jobs", str(args.jobs)]
                seconds = timed([*cmd, "--no-progress"], env, log)
                rows.append((f"`transferbench run {t} --suite {suite}`", seconds))
                print(f"{t}: {minutes(seconds)}", flush=True)
        else:
            seconds = timed([*tb, "leaderboard", "results/runs", "-o", "results/LEADERBOARD.md"], env, log)
            rows.append(("`transferbench leaderboard results/runs`", seconds))

    total = sum(s for _, s in rows)
    lines = ["| step | wall time |", "|---|---|", *(f"| {what} | {minutes(s)} |" for what, s in rows)]
    lines.append(f"| all, one after another, from a fresh home | {minutes(total)} |")
    times_path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"times written to {times_path}; the home used was {home}")


if __name__ == "__main__":
    main()
