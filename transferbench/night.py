"""One night of the regression gate (`transferbench nightly`; docs/regression.md#a-night), its steps in the order
they run:

1. **run** tonight's suite into OUT/DATE (resumable), its `bf16: auto` steps pinned to the anchor's choices;
2. **find or rebuild the baseline** of tonight's arithmetic: the anchor itself where its records were computed in
   tonight's arithmetic; else the anchor rebuilt on this runner, cached per (anchor commit, arithmetic digest);
   else rebuilt now: a git worktree at the commit the anchor's records name, whose own `transferbench nightly`
   runs the same suite with the same options on this runner. The arithmetic of a cell (threads a worker sets,
   precision) is known for certain only from tonight's records, so the baseline is found after the run;
3. **judge** (gate.decide.decide) exactly: against that baseline with the acceptance ledger beside the anchor
   (gate.ledger), and against this arithmetic's rolling baseline, the last night that passed, where there is
   one. A night fails if either judgment fails;
4. **keep**: a night that passed, with every expected cell, judged exactly against known-good code on its own
   arithmetic, becomes its arithmetic's rolling baseline (replacing the last, whatever its size); no other night
   ever does;
5. **render** (reporting.regress): REGRESSION.md and LEADERBOARD.md.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .anchor import ANCHORS, Baseline, Rebuild, find_baseline, home_anchors, records_commit
from .errors import UserError


@dataclass
class Judgment:
    """One exact judgment of tonight against one baseline."""

    name: str  # 'the anchor' | 'the rolling baseline'
    folder: Path
    decision: object  # gate.decide.Decision
    ledger: list = field(default_factory=list)  # report lines: the ledger entries applied

    @property
    def code(self) -> int:
        return self.decision.code

    @property
    def exact(self) -> bool:
        """Every matched cell judged to the bit (cells of a declared protocol change aside)."""
        t = self.decision.gate.exact
        return t.enabled and t.statistical == t.by_declaration


@dataclass
class Night:
    anchor: Path  # --baseline: the committed anchor (results/nightly) or any records folder
    out: Path
    date: str
    suite: str = "nightly"
    tasks: list | None = None
    backbones: list | None = None
    seeds: object = None
    gate: object = None  # gate.decide.GateOptions (None: the defaults); the ledger's entries are added per judgment
    allow_missing: object = ()
    rolling: Path | None = None
    rebuild: bool = True
    figures: dict | None = field(default=None, init=False)  # task -> its leaderboard figures, once rendered

    @property
    def current(self) -> Path:
        return self.out / self.date

    def run(self, options, executor) -> tuple[str, int]:
        """The night, top to bottom (module docstring). Returns (report, exit code)."""
        from .arithmetic import arithmetic_key
        from .records.store import load_records

        anchor = self.anchor_records()
        ran = self.run_suite(anchor, options, executor)
        tonight = load_records([self.current])
        expected = [r for r in anchor if self.expected(r, ran)]
        key = arithmetic_key(tonight)
        baseline = find_baseline(self.anchor, expected, tonight, key, self._rebuild(ran, options), self._keep_rule(ran))
        judgments = [self.judge("the anchor", baseline.folder, baseline.records, tonight, ran, code_of=expected)]
        roll = self.rolling / key if self.rolling is not None else None
        if roll is not None and roll.is_dir():
            last = anchor_cells([r for r in load_records([roll]) if self._keep_rule(ran)(r)], expected)
            judgments.append(self.judge("the rolling baseline", roll, last, tonight, ran, code_of=expected))
        code = max(j.code for j in judgments)
        kept = self._keep(judgments, roll, code)
        text = self._render(judgments, baseline, roll, kept, code)
        return text, code

    # --- 1. run -------------------------------------------------------------------------------------------------

    def anchor_records(self) -> list:
        """The anchor's records of tonight's suite (a plain --date checked first)."""
        from .records.store import load_records

        if not self.date or "/" in self.date or self.date.startswith("."):
            raise UserError(f"--date {self.date!r}: give a plain folder name such as 2026-11-23")
        anchor = [r for r in load_records([self.anchor]) if self._mine(r)]
        if not anchor and not self.tasks:
            raise UserError(
                f"--baseline {self.anchor} holds no records of suite {self.suite!r}: give a records folder "
                f"of a `transferbench run TASK --suite {self.suite}` (or --tasks to run without a baseline)"
            )
        return anchor

    def run_suite(self, anchor: list, options, executor) -> set:
        """Run every task's suite into tonight's folder, everything checked before the first cell; returns the
        (task, backbone) pairs that ran."""
        from .adapters import prepare_task
        from .arithmetic import pins_of
        from .workflows import check_backbones, prepare, run_cells

        names = self.tasks or sorted({r["task"] for r in anchor})
        prepared = [prepare_task(t, suite=self.suite, seeds=self.seeds) for t in names]
        chosen = {t.name: check_backbones(t, self.backbones) for t in prepared}
        resolved = {t.name: prepare(t, chosen[t.name], self.current, options.data_dir) for t in prepared}
        options = dataclasses.replace(options, pins=pins_of(anchor))
        for task in prepared:
            refs, made = resolved[task.name]
            run_cells(task, refs, self.current, options, executor, made)
        return {(t.spec.task, b) for t in prepared for b in chosen[t.name]}

    def expected(self, r: dict, ran: set) -> bool:
        """Whether tonight should hold this baseline record: every backbone of the tasks run, unless named."""
        if self.backbones is not None:
            return (r["task"], r["backbone"]) in ran
        return r["task"] in {task for task, _ in ran}

    def _mine(self, r: dict) -> bool:
        return (r.get("suite") or "") == self.suite

    # --- 2. find or rebuild the baseline (anchor.find_baseline) -------------------------------------------------

    def _rebuild(self, ran: set, options) -> Rebuild:
        cache = self.rolling / ANCHORS if self.rolling is not None else home_anchors()
        tasks = tuple(sorted({t for t, _ in ran}))
        backbones = tuple(self.backbones) if self.backbones is not None else None
        return Rebuild(self.suite, tasks, backbones, self.seeds, options.config, cache, self.rebuild)

    def _keep_rule(self, ran: set):
        """A baseline record of tonight's suite and cells."""
        return lambda r: self._mine(r) and self.expected(r, ran)

    # --- 3. judge -----------------------------------------------------------------------------------------------

    def judge(self, name: str, folder: Path, base: list, tonight: list, ran: set, code_of=None) -> Judgment:
        """Tonight against `base` exactly, with the ledger beside the anchor; `code_of`: the anchor's records, whose
        code the noise model must be of, whatever the baseline."""
        from .gate import ledger as ledgers
        from .gate.decide import GateOptions, decide

        base = [r for r in base if self.expected(r, ran)]
        book = ledgers.load(self.anchor)
        accept, accept_code, lines = book.accepts()
        if not base:
            raise UserError(f"{name} {folder} holds no records of tonight's tasks: give another --baseline")
        options = dataclasses.replace(
            (self.gate or GateOptions()).accepting(accept, accept_code),
            fail_on_failed=True,
            allow_missing=self.allow_missing,
            code_of=code_of or None,
        )
        decision = decide(base, tonight, options)
        unused = book.unused(decision.gate)
        if unused:
            lines = lines + ["- matching nothing tonight:", *(f"  {x}" for x in unused)]
        return Judgment(name, folder, decision, lines)

    # --- 4. keep ------------------------------------------------------------------------------------------------

    def _keep(self, judgments: list, roll: Path | None, code: int) -> str:
        """Keep tonight as the rolling baseline where it passed every judgment, the anchor's exactly."""
        if roll is None:
            return ""
        if code:
            return "not kept as the rolling baseline: the night failed"
        if not judgments[0].exact:
            return (
                "not kept as the rolling baseline: tonight was not judged exactly against known-good code "
                f"({judgments[0].decision.gate.exact.statistical} cells judged statistically)"
            )
        keep_rolling(self.current, roll)
        return f"kept as the rolling baseline {roll}"

    # --- 5. render ----------------------------------------------------------------------------------------------

    def _render(self, judgments: list, baseline: Baseline, roll: Path | None, kept: str, code: int) -> str:
        from .reporting.regress import night_report

        text = night_report(
            f"Nightly {self.date}: {self.current}",
            judgments,
            baseline_notes=list(baseline.notes),
            rolling=roll is not None,
            kept=kept,
            failed=code,
        )
        (self.current / "REGRESSION.md").write_text(text)
        self.figures = _write_board(self.current)
        return text


# --- re-anchoring --------------------------------------------------------------------------------------------------


def reanchor(anchor: Path, *, suite="nightly", tasks=None, backbones=None, gate: dict, options, executor) -> str:
    """Regenerate the anchor from this clean checkout (`transferbench reanchor`): run its tasks' suite into a
    staging folder beside it, compare the old anchor with the new (REANCHOR.md, ledger entries accepted), put the
    new records in the old ones' place and empty the ledger. Returns the comparison."""
    from .engine.compute import environment
    from .gate import ledger as ledgers
    from .gate.decide import GateOptions
    from .paths.writes import move_folder
    from .records.store import load_records
    from .reporting.regress import decision_report

    env = environment()
    if not env.get("git_sha"):
        raise UserError(
            "re-anchoring needs a git checkout of transferbench: the anchor's records must name the commit that "
            "computed them, for later nights to rebuild it"
        )
    if env.get("git_dirty"):
        raise UserError(
            "the checkout has uncommitted changes: commit them first, so that the new anchor names a commit a later "
            "night can rebuild (git stash, or git commit)"
        )
    anchor = Path(anchor)
    staging = anchor.parent / f".{anchor.name}.reanchor-{os.getpid()}"
    night = Night(anchor=anchor, out=staging, date="anchor", suite=suite, tasks=tasks, backbones=backbones, gate=gate)
    try:
        old = night.anchor_records()
        ran = night.run_suite(old, options, executor)
        new = load_records([night.current])
        expected = [r for r in old if night.expected(r, ran)]
        accept, accept_code, lines = ledgers.load(anchor).accepts()
        # re-anchoring takes changes on purpose: the report lists them
        judged = dataclasses.replace(
            (gate or GateOptions()).accepting(accept, accept_code), allow_missing=True, allow_improvement=True
        )
        was = records_commit(expected) or "several commits"
        title = f"Re-anchoring {anchor}: the old anchor ({was}) vs {env['git_sha']}"
        text, _ = decision_report(expected, new, judged, title=title)
        if lines:
            text += "\n\nAcceptance ledger entries of the old anchor:\n\n" + "\n".join(lines) + "\n"
        (night.current / "REANCHOR.md").write_text(text)
        for name in ("REGRESSION.md", "LEADERBOARD.md"):
            (night.current / name).unlink(missing_ok=True)
        move_folder(night.current, anchor)
        ledgers.empty(anchor)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(
        f"re-anchored {anchor} at {env['git_sha'][:12]}: review {anchor / 'REANCHOR.md'}, then commit it with the "
        "noise model re-measured on the new anchor's code (python -m benchmarks.noise_model --work W)",
        file=sys.stderr,
    )
    return text


def _cell(r: dict) -> tuple:
    """What a cell is, whatever its settings: task, data set, backbone, stage, seed."""
    return (r["task"], r["dataset"], r["backbone"], r.get("stage", ""), r["seed"])


def anchor_cells(rolling: list, anchor: list) -> list:
    """The rolling baseline's records of the cells the anchor holds: a suite that shrinks on purpose (the anchor
    re-made without some cells) must not fail forever against a last night that still holds them."""
    cells = {_cell(r) for r in anchor}
    return [r for r in rolling if _cell(r) in cells]


def keep_rolling(night: Path, roll: Path) -> None:
    """Tonight's records become the rolling baseline `roll`, replacing the last one whatever its size (a suite that
    shrinks on purpose passes with every expected cell, and must not fail against a larger one forever)."""
    from .paths.writes import atomic_path

    with atomic_path(roll, directory=True, what="the rolling baseline") as tmp:
        shutil.copytree(
            night, tmp, ignore=shutil.ignore_patterns(".locks", "*.md", "*.png", "*.svg"), dirs_exist_ok=True
        )
    print(f"tonight's records are the rolling baseline {roll}", file=sys.stderr)


def _write_board(current: Path) -> dict:
    """Tonight's leaderboard beside its records; returns each task's figures."""
    from .engine.compute import environment
    from .reporting.leaderboard import draw_leaderboard

    board, figures = draw_leaderboard([current], current / "LEADERBOARD.md", git_sha=environment()["git_sha"])
    print(f"wrote {current / 'REGRESSION.md'} and {board}", file=sys.stderr)
    return figures
