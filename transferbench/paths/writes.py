"""How transferbench writes a file or folder: aside, then renamed into place (`atomic_path`), so that a reader sees
the old content or the new and a killed writer leaves only a dot-named temporary (`remove_stale_temps`); a finished
folder put in another's place (`move_folder`); the probe
that a folder takes writes before anything is computed for it (`probe`, `check_home`); and the one line that a write
the filesystem refused (full, over quota, read-only) ends in (`write_error`), closing with how to go on (`RESUME`)."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import UserError
from .home import CACHES, HOME_VARIABLE, cache, home, home_words

TMP_MARK = ".tmp"  # temporary names are '.NAME.tmp<pid>-<host>[suffix]': a reader skips dot files
HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]  # temporaries of this host's processes
_TEMP = re.compile(re.escape(TMP_MARK) + r"(\d+)-([0-9a-f]{8})")
DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}
# how a run stopped by its machine goes on: every such one-line error ends with it
RESUME = "rerun the same command: finished cells are kept and the unfinished ones are computed again"


def temp_path(path: Path, suffix: str = "") -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{HOST}{suffix}")


def remove(p: Path) -> None:
    """A file or a folder with what it holds, gone (nothing if it was gone already)."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _size(p: Path) -> int:
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size
    except OSError:
        return 0


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def write_error(e: OSError, path, needed: int = 0, *, what: str = "", exact: bool = False) -> UserError | None:
    """The one-line error for a write that the filesystem refused (full, over quota, read-only), naming the
    path, the space the write needed (`needed` bytes; more than that unless `exact`) and the fix; None for any
    other OSError."""
    if e.errno not in DISK_FULL | NOT_WRITABLE:
        return None
    path = Path(path)
    folder = path.parent
    under_home = home() in (path, *path.parents)
    fix = (
        f"free space there or set {HOME_VARIABLE} to a folder on a bigger disk"
        if under_home
        else "free space there or write to another folder (--out)"
    )
    if e.errno in DISK_FULL:
        try:
            free = human(shutil.disk_usage(next(p for p in (folder, *folder.parents) if p.exists())).free)
        except (OSError, StopIteration):
            free = "unknown"
        need = f"needs {'' if exact else 'more than '}{human(needed)}" if needed else "needs more space"
        why = f"{(e.strerror or 'no space left on device').lower()}: it {need}, {free} free there"
    else:
        why = (e.strerror or "not writable").lower()
        fix = f"set {HOME_VARIABLE} to a writable folder" if under_home else "give a writable folder (--out)"
    where = f"{home_words()}: " if under_home else ""
    return UserError(f"{where}cannot write {what + ' ' if what else ''}{path}: {why}; {fix}, then {RESUME}")


@contextmanager
def aside(path: Path, suffix: str, directory: bool, needed: int = 0, what: str = "") -> Iterator[Path]:
    """The temporary of `path` for the body of the with-statement (which renames it into place); removed
    afterwards whatever happens. A write the filesystem refuses (full, read-only) is one UserError."""
    tmp = temp_path(path, suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove(tmp)
        if directory:
            tmp.mkdir()
        yield tmp
    except OSError as e:
        err = write_error(e, path, needed or _size(tmp), what=what, exact=bool(needed))
        if err is None:
            raise
        raise err from None
    finally:
        remove(tmp)


@contextmanager
def atomic_path(path, *, suffix: str = "", directory: bool = False, needed: int = 0, what: str = "") -> Iterator[Path]:
    """Write `path` aside and rename it into place: a reader sees the old content or the new, never a torn one,
    and a killed writer leaves only a dot-named temporary (`remove_stale_temps`). Yields the temporary path (a
    new empty folder with `directory`; `suffix` keeps an extension that a writer insists on, as numpy's savez
    does). A write the filesystem refuses (full, read-only) leaves nothing behind and is one UserError naming
    `what` is written and the `needed` bytes when the caller knows them."""
    path = Path(path)
    with aside(path, suffix, directory, needed, what) as tmp:
        yield tmp
        if directory:
            move_folder(tmp, path)  # a folder is not replaced by rename while it has files: the old one goes aside
        else:
            os.replace(tmp, path)


def move_folder(src, dest) -> None:
    """The finished folder `src` put in place at `dest` on the same filesystem, replacing any folder there: the old
    one is renamed aside first (a dot-named temporary), so `dest` is never a mix of the two, and removed after."""
    src, dest = Path(src), Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    old = temp_path(dest, ".old")
    remove(old)
    if dest.exists():
        os.replace(dest, old)
    os.replace(src, dest)
    remove(old)


def probe(folder: Path) -> list[Path]:
    """`folder` made if missing (with its parents) and written to once, by a dot-named temporary removed again.
    Returns the folders it made, outermost first, so that a caller stopped later can remove them again; where nothing
    can be written, it removes the empty ones it made and raises the OSError that says why."""
    made = [p for p in (folder, *folder.parents) if not p.exists()][::-1]
    test = temp_path(folder / "write-test")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            test.write_bytes(b"x")  # on a full disk the file is made and its byte refused: it goes again below
        finally:
            test.unlink(missing_ok=True)
    except OSError:
        remove_empty(made)
        raise
    return made


def remove_empty(folders: list[Path]) -> None:
    """Remove `folders` (outermost first, as `probe` returns them), innermost first, where they are still empty."""
    for p in reversed(folders):
        try:
            p.rmdir()
        except OSError:
            pass


def check_home() -> Path:
    """$TRANSFERBENCH_HOME made if missing and written to once (`probe`), or one UserError naming the variable, the
    path and the fix: called before any data is generated or any cell runs."""
    root = home()
    try:
        probe(root)
    except OSError as e:
        raise UserError(
            f"{home_words()}: cannot write to {root} ({e.strerror or e}); it holds the embedded data "
            f"and every cache: set {HOME_VARIABLE} to a writable folder with a few GB free"
        ) from None
    return root


def remove_stale_temps(root, *, recursive: bool = True) -> int:
    """Temporaries under `root` left by a writer of this host that is gone (killed mid-write): removed.
    Returns how many."""
    removed = 0
    root = Path(root)
    if not root.is_dir():
        return 0
    for p in list((root.rglob if recursive else root.glob)(f".*{TMP_MARK}*")):
        m = _TEMP.search(p.name)
        if m and m.group(2) == HOST and not _alive(int(m.group(1))):
            remove(p)
            removed += 1
    return removed


def clean_home() -> int:
    """`remove_stale_temps` in every cache folder (the embedded data's top level only: its sets are folders
    written aside whole). Returns how many went."""
    return sum(remove_stale_temps(cache(name), recursive=name != "embedded") for name in CACHES)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
