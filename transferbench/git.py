"""The git checkout transferbench runs from, by one rule: the repository whose top holds this package as its
`transferbench/` folder. An installed wheel (or a copy of the package inside someone else's repository) runs from
no checkout: its version says what it is. Records name the checkout's HEAD and whether tracked files differ from
it (engine.compute.environment); the nightly rebuilds an anchor from its history (transferbench.anchor)."""

from __future__ import annotations

import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _git(args: list[str], cwd: Path, timeout: float = 10) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None


def checkout() -> Path | None:
    """The top of the git checkout this package runs from, or None (module docstring)."""
    out = _git(["rev-parse", "--show-toplevel"], PACKAGE, timeout=5)
    if out is None or out.returncode or not out.stdout.strip():
        return None
    top = Path(out.stdout.strip()).resolve()
    return top if top / "transferbench" == PACKAGE else None


def state() -> tuple[str | None, bool | None]:
    """(HEAD's sha, whether tracked files differ from it) of the checkout; (None, None) where there is none."""
    top = checkout()
    if top is None:
        return None, None
    head = _git(["rev-parse", "HEAD"], top, timeout=5)
    if head is None or head.returncode:
        return None, None
    status = _git(["status", "--porcelain", "--untracked-files=no"], top)
    dirty = bool(status.stdout.strip()) if status is not None and status.returncode == 0 else None
    return head.stdout.strip(), dirty


def has_commit(top: Path, commit: str) -> bool:
    """Whether the checkout's history holds `commit`."""
    out = _git(["cat-file", "-e", f"{commit}^{{commit}}"], top)
    return out is not None and out.returncode == 0
