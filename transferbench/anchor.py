"""The nightly's anchor (transferbench.night, docs/regression.md#a-night), and the one call that finds or rebuilds
the baseline tonight is judged against (`find_baseline`): the anchor itself where its records were computed in
tonight's arithmetic; else the anchor rebuilt on this runner, cached per (anchor commit, arithmetic digest); else
rebuilt now, a git worktree at the commit the anchor's records name whose own `transferbench nightly` reruns the
anchor's suite with tonight's execution options. Where it cannot be rebuilt (the records name no single clean commit,
`--no-rebuild`, a night that is itself a rebuild, a rerun that is not the anchor's code) tonight is judged
statistically against the anchor, and the baseline says why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import yaml

from .errors import UserError

ANCHORS = "anchors"  # beside the rolling baselines (or in $TRANSFERBENCH_HOME): anchors rebuilt on a runner
ANCHOR_INFO = "ANCHOR.yaml"  # in a rebuilt anchor: its commit, arithmetic, command, time and exit code
# set in the anchor's rerun: a nightly that is itself rebuilding an anchor never rebuilds one (an anchor of code that
# rebuilds would otherwise rebuild itself again and again)
REBUILDING = "TRANSFERBENCH_REBUILDING_ANCHOR"
ARITHMETIC_REPORT = "ARITHMETIC.md"  # in a rebuilt anchor: it against the committed anchor (a change of arithmetic)


class Source(StrEnum):
    """Where the baseline's records come from."""

    ANCHOR = "the anchor, computed in tonight's arithmetic"
    CACHED = "the anchor rebuilt on this runner earlier, cached"
    REBUILT = "the anchor rebuilt on this runner tonight"
    STATISTICAL = "the anchor, of other arithmetic: judged statistically"


@dataclass(frozen=True)
class Rebuild:
    """What rebuilding the anchor on this runner takes: tonight's suite, tasks, backbones and seeds, its execution
    options (`config`, the records' own), where rebuilds are cached (beside the rolling baselines, else
    $TRANSFERBENCH_HOME), and whether rebuilding is allowed (`--no-rebuild`)."""

    suite: str
    tasks: tuple
    backbones: tuple | None
    seeds: object
    config: dict
    cache: Path
    allowed: bool = True


@dataclass(frozen=True)
class Baseline:
    """The anchor as tonight is judged against it: its records, the folder they are in, where they come from (and
    why, in words), the notes the night's report carries, and the rebuilt anchor's judgment against the committed
    one (its headline; "" where there is none)."""

    records: list
    folder: Path
    source: Source
    how: str
    notes: tuple = field(default_factory=tuple)
    arithmetic_headline: str = ""


def find_baseline(anchor: Path, expected: list, tonight: list, key: str, rebuild: Rebuild, keep: Callable) -> Baseline:
    """The baseline of tonight's arithmetic (`key`) for the anchor's `expected` records (module docstring); `keep`
    picks a rebuilt anchor's records of tonight's cells."""
    from .records.store import load_records

    foreign = foreign_cells(expected, tonight)
    if not foreign:
        return Baseline(expected, anchor, Source.ANCHOR, f"the anchor {anchor}, computed in tonight's arithmetic")
    why = f"{foreign} of its cells were computed in other arithmetic than tonight's"
    commit, problem = anchor_commit(expected)
    if os.environ.get(REBUILDING):
        problem = "this night is itself an anchor's rerun, which rebuilds nothing"
    elif not rebuild.allowed:
        problem = "--no-rebuild: not rebuilt"
    elif problem:
        problem = f"the anchor cannot be rebuilt: {problem}"
    if problem:
        return _statistical(expected, anchor, f"{why}; {problem}; judged statistically")
    dest = rebuild.cache / f"{commit[:12]}-{key}"
    cached = (dest / ANCHOR_INFO).is_file()
    if not cached:
        rebuild_anchor(anchor, commit, dest, rebuild)
    info = yaml.safe_load((dest / ANCHOR_INFO).read_text())
    when = (
        f"on {info.get('made', '?')} ({dest}, cached)" if cached else f"tonight in {minutes(info['seconds'])} ({dest})"
    )
    how = f"the anchor at {commit[:12]} rebuilt on this runner {when}"
    records = [r for r in load_records([dest]) if keep(r)]
    other = unreproduced_code(expected, records)
    if other:  # code outside this checkout (a plugin) computed the anchor: the rerun is not the anchor's code
        shutil.rmtree(dest, ignore_errors=True)
        return _statistical(
            expected,
            anchor,
            f"{why}; the anchor's rerun at {commit[:12]} did not reproduce its code ({other}: code outside this "
            "checkout, such as a plugin, computed it), so it was discarded; judged statistically",
        )
    line = info.get("headline") or "(not recorded: rebuilt by an older transferbench)"
    notes = (
        f"{why}: {how}.",
        f"The rebuilt anchor against the committed one, a pure change of arithmetic ({dest / ARITHMETIC_REPORT}): "
        f"{line}",
    )
    return Baseline(records, dest, Source.CACHED if cached else Source.REBUILT, how, notes, line)


def _statistical(expected: list, anchor: Path, note: str) -> Baseline:
    return Baseline(expected, anchor, Source.STATISTICAL, note, (note,))


def foreign_cells(expected: list, tonight: list) -> int:
    """How many of the anchor's expected cells tonight holds in another machine's arithmetic (or none recorded)."""
    from .arithmetic import machine_differences

    mine = {r["key"]: r for r in tonight if r.get("status") == "ok"}
    return sum(
        1
        for r in expected
        if r["key"] in mine and machine_differences(r.get("arithmetic"), mine[r["key"]].get("arithmetic"))
    )


def unreproduced_code(anchor: list, rerun: list) -> str:
    """In words, the modules whose code differs between the anchor's records and their rerun, cell by cell; '' where
    every rerun cell was computed by the anchor's own code."""
    from .fingerprint import changed_modules

    again = {r["key"]: r for r in rerun}
    changed: set = set()
    for r in anchor:
        a, b = r.get("fingerprint"), (again.get(r["key"]) or {}).get("fingerprint")
        if a and b and a.get("digest") != b.get("digest"):
            changed |= {m for m, _ in changed_modules(a, b)} or {"libraries"}
    return ", ".join(sorted(changed))


def records_commit(records: list) -> str | None:
    """The one commit that computed `records` (their `environment.git_sha`), or None where they name several."""
    shas = {(r.get("environment") or {}).get("git_sha") for r in records}
    return shas.pop() if len(shas) == 1 else None


def anchor_commit(records: list) -> tuple[str | None, str | None]:
    """(the commit the anchor's records were computed at, None) or (None, why it cannot be rebuilt)."""
    envs = [r.get("environment") or {} for r in records]
    shas = {e.get("git_sha") for e in envs}
    if None in shas or not shas:
        return None, "its records name no commit (computed outside a git checkout)"
    if len(shas) > 1:
        return None, f"its records name {len(shas)} commits; re-anchor from one (transferbench reanchor)"
    if any(e.get("git_dirty") for e in envs):
        return None, "its records were computed from uncommitted changes; re-anchor from a clean checkout"
    return shas.pop(), None


def home_anchors() -> Path:
    from .paths.home import home

    return home() / ANCHORS


def rebuild_anchor(anchor: Path, commit: str, dest: Path, rebuild: Rebuild) -> None:
    """Rerun the anchor's code on this runner: a git worktree at `commit`, whose own `transferbench nightly` runs
    tonight's suite and tasks (pinned to the committed anchor's precision choices, as tonight is) with tonight's
    execution options, into `dest`, with what it did (ANCHOR.yaml, its headline too) and how it compares with
    the committed anchor (ARITHMETIC.md). Its progress goes to the terminal and to `dest`.log. A failure is one
    line, exit 2; tonight's records stay."""
    suite, tasks, backbones, seeds = rebuild.suite, list(rebuild.tasks), rebuild.backbones, rebuild.seeds
    repo = _repository_with(commit)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tree = dest.parent / f".worktree-{dest.name}-{os.getpid()}"
    work = dest.parent / f".run-{dest.name}-{os.getpid()}"
    log = dest.with_name(dest.name + ".log")
    subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)
    add = subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), commit], cwd=repo, capture_output=True, text=True
    )
    if add.returncode:
        raise UserError(f"cannot check out the anchor's commit {commit[:12]}: {add.stderr.strip().splitlines()[-1]}")
    _own_tasks(tree)
    cmd = [sys.executable, "-m", "transferbench.cli", "nightly", "--baseline", str(Path(anchor).resolve())]
    cmd += ["--out", str(work.resolve()), "--date", "anchor", "--suite", suite, "--tasks", ",".join(tasks)]
    cmd += ["--no-progress", *_execution_argv(rebuild.config)]
    cmd += ["--backbone", ",".join(backbones)] if backbones else []
    cmd += ["--seeds", ",".join(map(str, seeds))] if seeds else []
    print(
        f"the anchor's records were computed in other arithmetic: rebuilding it at {commit[:12]} on this runner "
        f"(log: {log})",
        file=sys.stderr,
    )
    started = time.monotonic()
    try:
        rc = _stream(cmd, tree, log, commit)
        seconds = time.monotonic() - started
        if rc not in (0, 1) or not (work / "anchor").is_dir():
            raise UserError(
                f"rebuilding the anchor at {commit[:12]} failed (exit {rc}): see {log}; tonight's records stay in "
                "their folder, and a rerun of the same --date judges them without running them again"
            )
        info = {"commit": commit, "anchor": str(anchor), "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        info.update(seconds=round(seconds, 1), exit=rc, command=cmd[1:])
        _seal(work / "anchor", dest, anchor, suite, tasks, info)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=repo, capture_output=True)
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)
    print(f"rebuilt the anchor at {commit[:12]} in {minutes(seconds)}: {dest}", file=sys.stderr)


def _repository_with(commit: str) -> Path:
    """The git checkout this package runs from, where it holds `commit`; else one line naming the fix."""
    from . import git

    repo = git.checkout()
    if repo is None:
        raise UserError(
            f"the anchor's code (commit {commit[:12]}) cannot be checked out: transferbench does not run from a git "
            "checkout; run the nightly from a clone with its history (actions/checkout: fetch-depth: 0), or pass "
            "--no-rebuild to judge statistically"
        )
    if not git.has_commit(repo, commit):
        raise UserError(
            f"the anchor's commit {commit[:12]} is not in {repo}'s history: fetch it (git fetch --unshallow; "
            "actions/checkout: fetch-depth: 0), or pass --no-rebuild to judge statistically"
        )
    return repo


def _stream(cmd: list, tree: Path, log: Path, commit: str) -> int:
    """Run the anchor's nightly in its worktree (its package first on the path, marked as a rebuild so that it
    rebuilds nothing itself); its output goes to `log`, its progress lines to the terminal too. Returns its exit."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, REBUILDING: commit, "PYTHONPATH": path}
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            f.write(line)
            f.flush()
            sys.stderr.write(f"  anchor {commit[:7]}: {line}")
        return proc.wait()


def _seal(night: Path, dest: Path, anchor: Path, suite: str, tasks: list, info: dict) -> None:
    """Put the rerun's records in place at `dest` with what it did (ANCHOR.yaml) and its comparison with the
    committed anchor (ARITHMETIC.md), its own night's report and leaderboard left out."""
    from .gate.decide import decide
    from .paths.writes import move_folder
    from .records.store import load_records
    from .reporting.regress import decision_text, headline

    for name in ("REGRESSION.md", "LEADERBOARD.md"):
        (night / name).unlink(missing_ok=True)
    committed = [r for r in load_records([anchor]) if (r.get("suite") or "") == suite and r["task"] in tasks]
    decision = decide(committed, load_records([night]), allow_missing=True)
    title = f"The anchor rebuilt on this runner vs {anchor}"
    (night / ARITHMETIC_REPORT).write_text(decision_text(decision, title))
    info["headline"] = headline(decision.gate, decision.reasons)
    (night / ANCHOR_INFO).write_text(yaml.safe_dump(info, sort_keys=False))
    move_folder(night, dest)


def _own_tasks(tree: Path) -> None:
    """The task specs ship as `transferbench.tasks` from the repository's top-level tasks/ folder; an editable
    install maps that name to the working tree's folder, whatever package is imported. A link inside the worktree's
    package makes the anchor's code read the anchor's own specs (the link is untracked: the checkout stays clean)."""
    link = tree / "transferbench" / "tasks"
    if (tree / "tasks").is_dir() and not link.exists():
        link.symlink_to(Path("..") / "tasks", target_is_directory=True)


def _execution_argv(config: dict) -> list[str]:
    """The execution options of tonight's command (its records' `config`), as the anchor's rerun takes them."""
    argv = ["--jobs", str(config.get("jobs") or 1)]
    for name, flag in (
        ("device", "--device"),
        ("data_dir", "--data-dir"),
        ("micro_batch", "--micro-batch"),
        ("cpus_per_cell", "--cpus-per-cell"),
        ("executor", "--executor"),
        ("address", "--address"),
    ):
        if config.get(name) not in (None, "", "local" if name == "executor" else None):
            argv += [flag, str(config[name])]
    if config.get("workers"):
        argv += ["--workers", str(config["workers"])]
    if config.get("compile") in (True, "on"):
        argv.append("--compile")
    elif config.get("compile") == "off":
        argv += ["--compile", "off"]
    return argv


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"
