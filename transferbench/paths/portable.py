"""A file's path as a record keeps it, never one machine's absolute path (`portable`), and the path that this form
names on this machine (`expand`)."""

from __future__ import annotations

from pathlib import Path

from .home import HOME_VARIABLE, home

PACKAGE = Path(__file__).resolve().parents[1]  # transferbench/


def portable(path) -> str | None:
    """A file's path as a record keeps it, never one machine's absolute path: `$TRANSFERBENCH_HOME/...` under the
    home, relative under the working directory, `transferbench/...` inside the package, else the file's name alone
    (its sha256 beside it in the record identifies it). `expand` turns the home form back into a path."""
    if path is None:
        return None
    p = Path(path).expanduser().resolve()
    for root, prefix in ((home().expanduser().resolve(), f"${HOME_VARIABLE}"), (PACKAGE, "transferbench")):
        if root in p.parents:
            return f"{prefix}/{p.relative_to(root).as_posix()}"
    cwd = Path.cwd().resolve()
    return p.relative_to(cwd).as_posix() if cwd in p.parents else p.name


def expand(text: str) -> Path:
    """The path a record's `portable` form names on this machine."""
    if text.startswith(f"${HOME_VARIABLE}/"):
        return home() / text.split("/", 1)[1]
    if text.startswith("transferbench/"):
        return PACKAGE / text.split("/", 1)[1]
    return Path(text)
