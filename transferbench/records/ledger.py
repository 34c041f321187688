"""The acceptance ledger: the changes that move the nightly's numbers on purpose, declared in the repository beside
the anchor they are judged against (`results/nightly/ACCEPTED.yaml`; docs/regression.md#the-acceptance-ledger).

Each entry names the commit that made the change, what it changes (code modules, as `--accept-code` takes them,
and protocol settings, as `--accept` takes them) and why. `nightly` and `regress` read the ledger of their baseline
folder. An entry applies to a comparison whose baseline was computed before its commit (the baseline records'
`git_sha` does not contain the commit): against the anchor every entry since the anchor applies, night after
night, while against a rolling baseline made after the commit the entry no longer covers a second change of the
same module. Re-anchoring (`transferbench reanchor`) empties the ledger.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import UserError

LEDGER = "ACCEPTED.yaml"
EMPTY = """\
# The acceptance ledger of this anchor (docs/regression.md#the-acceptance-ledger): changes that move the nightly's
# numbers on purpose, made since these records. `transferbench nightly` and `regress` honour each entry against
# every baseline computed before its commit; `transferbench reanchor` empties it.
#
# accepted:
#   - commit: 1a2b3c4                      # the commit that makes the change
#     code: [backbones.dtn]                # modules whose changed numbers are meant (as --accept-code takes them)
#     protocol: ["fewshot:pool"]           # settings changed on purpose (as --accept takes them: TASK[:SETTING])
#     why: DTN's backward as one Gram product per head; only DTN backbones' cells move
accepted: []
"""
_SHA = re.compile(r"^[0-9a-f]{7,40}$")


@dataclass(frozen=True)
class Entry:
    commit: str
    code: tuple = ()
    protocol: tuple = ()
    why: str = ""


@dataclass
class Ledger:
    path: Path | None
    entries: list = field(default_factory=list)

    def applying(self, baseline_sha: str | None, repo: Path | None = None) -> tuple[list[Entry], list[str]]:
        """(the entries that apply against a baseline computed at `baseline_sha`, notes in words). An entry applies
        where its commit is not already in the baseline's history. Where that cannot be told (no git history, a
        commit unknown to it, a baseline of unknown commit), the entry applies and a note says why."""
        out, notes = [], []
        for e in self.entries:
            if not baseline_sha:
                out.append(e)
                notes.append(f"{e.commit}: applied (the baseline records name no commit)")
                continue
            contained = _is_ancestor(e.commit, baseline_sha, repo)
            if contained is None:
                out.append(e)
                notes.append(f"{e.commit}: applied (git cannot place it against the baseline's {baseline_sha[:12]})")
            elif not contained:
                out.append(e)
        return out, notes

    def accepts(self, baseline_sha: str | None, repo: Path | None = None) -> tuple[list, list, list[str]]:
        """(protocol names for `--accept`, modules for `--accept-code`, report lines) against that baseline."""
        entries, notes = self.applying(baseline_sha, repo)
        protocol = [p for e in entries for p in e.protocol]
        code = [m for e in entries for m in e.code]
        lines = [f"- {e.commit[:12]}: {', '.join([*e.code, *e.protocol])} ({e.why})" for e in entries]
        if self.entries and not entries:
            lines.append(f"- none of its {len(self.entries)} entries: the baseline already holds their commits")
        return protocol, code, lines + [f"- {n}" for n in notes]


def load(path: Path) -> Ledger:
    """The ledger at `path` (a file, or a records folder holding ACCEPTED.yaml); an empty one where there is none.
    A ledger that does not parse, or an entry without a commit, a change or a reason, is one line and exit 2."""
    path = Path(path)
    if path.is_dir():
        path = path / LEDGER
    if not path.is_file():
        return Ledger(None)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"{path}: not a readable YAML ledger ({str(e).splitlines()[0]}); fix it or empty it") from None
    items = doc.get("accepted") if isinstance(doc, dict) else None
    if items is None:
        items = [] if isinstance(doc, dict) and "accepted" in doc else None
    if not isinstance(items, list):
        raise UserError(f"{path}: give `accepted:` a list of entries (commit, code or protocol, why)")
    entries = []
    for i, item in enumerate(items, 1):
        where = f"{path}: entry {i}"
        if not isinstance(item, dict) or set(item) - {"commit", "code", "protocol", "why"}:
            raise UserError(f"{where}: give commit, code and/or protocol, and why (nothing else)")
        commit = str(item.get("commit") or "").strip().lower()
        if not _SHA.match(commit):
            raise UserError(f"{where}: commit {item.get('commit')!r} is not a git sha (7 to 40 hex digits)")
        code, protocol = _names(item.get("code"), where, "code"), _names(item.get("protocol"), where, "protocol")
        if not code and not protocol:
            raise UserError(f"{where}: name what changes: code (modules) or protocol (TASK[:SETTING])")
        why = str(item.get("why") or "").strip()
        if not why:
            raise UserError(f"{where}: say why the change is meant (why: ...)")
        entries.append(Entry(commit, code, protocol, why))
    return Ledger(path, entries)


def _names(value, where: str, what: str) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise UserError(f"{where}: {what} must be a list of names")
    return tuple(v.strip() for v in value)


def empty(path: Path) -> None:
    """Write an empty ledger (its header says how to fill it) at `path` (a file or a records folder)."""
    path = Path(path)
    (path / LEDGER if path.is_dir() else path).write_text(EMPTY)


def repository(start: Path | None = None) -> Path | None:
    """The git checkout that holds this package (or `start`), or None."""
    here = Path(start) if start else Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=here, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def _is_ancestor(commit: str, of: str, repo: Path | None) -> bool | None:
    """Whether `commit` is `of` or one of its ancestors; None where git cannot tell."""
    repo = repo or repository()
    if repo is None:
        return None
    try:
        out = subprocess.run(
            ["git", "merge-base", "--is-ancestor", commit, of], cwd=repo, capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(out.returncode)
