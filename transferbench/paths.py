"""Where transferbench writes besides --out: every cache folder under $TRANSFERBENCH_HOME, named here once,
the one way a file or folder is written there (aside, then renamed into place), and how a cache entry is
trusted: each carries its size and checksum, checked before it is read; a damaged one is set aside, never read."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError

log = logging.getLogger("transferbench")

CACHES = {
    "embedded": "the embedded suite's generated datasets (data.embedded)",
    "features": "frozen features per backbone, weights, transform, dataset and split (engine.features)",
    "bf16-probe": "bf16-or-fp32 decisions per device kind and step shape (engine.precision)",
    "checkpoints": "pretrained embedded checkpoints, and checkpoints a Ray worker received (adapters.pretrain, "
    "engine.executors)",
    "pretrain": "the records of on-demand embedded pretraining (adapters.pretrain)",
    "corruptions": "generated corrupted test images (data.corruptions)",
    "classifiers": "fine-tuned classifiers under test for robustness (adapters.corruption)",
    "lit": "trained LiT text towers (adapters.lit)",
    "cost-probe": "milliseconds per training image per device kind and model shape (engine.estimate)",
    "decoded": "small training sets decoded once and resized, held on the training device (engine.resident)",
}
HOME_VARIABLE = "TRANSFERBENCH_HOME"
DEFAULT_HOME = "~/.cache/transferbench"
TMP_MARK = ".tmp"  # temporary names are '.NAME.tmp<pid>-<host>[suffix]': a reader skips dot files
QUARANTINE = ".quarantine"  # damaged entries and records are renamed into this folder beside them
DIGEST_SUFFIX = ".digest"  # a file entry's digest, beside it: {"size", "algorithm", "checksum"} (file_digest)
MANIFEST = "MANIFEST.json"  # a folder entry's digest, inside it: {relative path: file_digest}
ARITHMETIC_KEY = "arithmetic"  # in a file's digest, and as ".arithmetic" in a MANIFEST: the machine that computed it
DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}


def home() -> Path:
    """$TRANSFERBENCH_HOME, default ~/.cache/transferbench."""
    return Path(os.environ.get(HOME_VARIABLE, DEFAULT_HOME)).expanduser()


def cache(name: str) -> Path:
    """The folder of one cache (not created)."""
    if name not in CACHES:
        raise KeyError(f"no cache folder {name!r}; caches: {', '.join(CACHES)}")
    return home() / name


def _home_words() -> str:
    where = (
        f"${HOME_VARIABLE}={os.environ[HOME_VARIABLE]}"
        if os.environ.get(HOME_VARIABLE)
        else f"${HOME_VARIABLE} (unset: {DEFAULT_HOME})"
    )
    return where


TALLY: Counter = Counter()  # (cache folder, 'read' | 'computed') -> entries, in this process (`tally`)


def tally(path, what: str) -> None:
    """Count one cache entry read (`verified` found it whole) or computed (`sealed` put it in place), by the cache
    folder it lies in: each cell's outcome carries its counts, and a run's summary line adds them up."""
    kind = _kind(path)
    if kind is not None:
        TALLY[(kind, what)] += 1


def _kind(path) -> str | None:
    """The cache folder that `path` lies in, or None outside the home's caches."""
    try:
        kind = Path(path).resolve().relative_to(home().resolve()).parts[0]
    except (ValueError, IndexError):
        return None
    return kind if kind in CACHES else None


def tally_since(before: Counter) -> dict:
    """{cache folder: {'read': n, 'computed': m}} counted since the snapshot `before` (a copy of TALLY)."""
    out: dict = {}
    for (kind, what), n in (TALLY - before).items():
        out.setdefault(kind, {"read": 0, "computed": 0})[what] = n
    return out


def check_home() -> Path:
    """$TRANSFERBENCH_HOME made if missing and written to once, or one UserError naming the variable, the
    path and the fix: called before any data is generated or any cell runs."""
    root = home()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test{TMP_MARK}{os.getpid()}-{HOST}"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as e:
        raise UserError(
            f"{_home_words()}: cannot write to {root} ({e.strerror or e}); it holds the embedded data "
            f"and every cache: set {HOME_VARIABLE} to a writable folder with a few GB free"
        ) from None
    return root


def portable(path) -> str | None:
    """A file's path as a record keeps it, never one machine's absolute path: `$TRANSFERBENCH_HOME/...` under the
    home, relative under the working directory, `transferbench/...` inside the package, else the file's name alone
    (its sha256 beside it in the record identifies it). `expand` turns the home form back into a path."""
    if path is None:
        return None
    p = Path(path).expanduser().resolve()
    package = Path(__file__).resolve().parent
    for root, prefix in ((home().expanduser().resolve(), f"${HOME_VARIABLE}"), (package, "transferbench")):
        if root in p.parents:
            return f"{prefix}/{p.relative_to(root).as_posix()}"
    cwd = Path.cwd().resolve()
    return p.relative_to(cwd).as_posix() if cwd in p.parents else p.name


def expand(text: str) -> Path:
    """The path a record's `portable` form names on this machine."""
    if text.startswith(f"${HOME_VARIABLE}/"):
        return home() / text.split("/", 1)[1]
    if text.startswith("transferbench/"):
        return Path(__file__).resolve().parent / text.split("/", 1)[1]
    return Path(text)


# --- writing ------------------------------------------------------------------------------------------

HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]  # temporaries of this host's processes
_TEMP = re.compile(re.escape(TMP_MARK) + r"(\d+)-([0-9a-f]{8})")


def temp_path(path: Path, suffix: str = "") -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{HOST}{suffix}")


def _remove(p: Path) -> None:
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
    where = f"{_home_words()}: " if under_home else ""
    return UserError(
        f"{where}cannot write {what + ' ' if what else ''}{path}: {why}; {fix}, then rerun the same "
        "command: finished cells are kept and the unfinished ones are computed again"
    )


@contextmanager
def _aside(path: Path, suffix: str, directory: bool, needed: int = 0, what: str = "") -> Iterator[Path]:
    """The temporary of `path` for the body of the with-statement (which renames it into place); removed
    afterwards whatever happens. A write the filesystem refuses (full, read-only) is one UserError."""
    tmp = temp_path(path, suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(tmp)
        if directory:
            tmp.mkdir()
        yield tmp
    except OSError as e:
        err = write_error(e, path, needed or _size(tmp), what=what, exact=bool(needed))
        if err is None:
            raise
        raise err from None
    finally:
        _remove(tmp)


@contextmanager
def atomic_path(path, *, suffix: str = "", directory: bool = False, needed: int = 0, what: str = "") -> Iterator[Path]:
    """Write `path` aside and rename it into place: a reader sees the old content or the new, never a torn one,
    and a killed writer leaves only a dot-named temporary (`remove_stale_temps`). Yields the temporary path (a
    new empty folder with `directory`; `suffix` keeps an extension that a writer insists on, as numpy's savez
    does). A write the filesystem refuses (full, read-only) leaves nothing behind and is one UserError naming
    `what` is written and the `needed` bytes when the caller knows them."""
    path = Path(path)
    with _aside(path, suffix, directory, needed, what) as tmp:
        yield tmp
        if directory:
            _remove(path)  # a folder is not replaced by rename while it has files
        os.replace(tmp, path)


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
            _remove(p)
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


# --- verified cache entries -----------------------------------------------------------------------------


def entry_lock(path):
    """The lock under which a cache entry is put in place or set aside (`.NAME.lock` beside it; the kernel
    releases it if its holder is killed)."""
    from filelock import FileLock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path.with_name(f".{path.name}.lock")))


BLOCK = 8 << 20  # the checksum's block: 8 MiB
ALGORITHM = "crc32-8MiB"


def checksum(path) -> str:
    """The CRC-32 of each 8 MiB block of a file (the check zip and PNG use), blocks in parallel threads over a
    memory map, folded into one sha256: it catches truncation, torn writes and damaged blocks at a fraction of
    what reading the file costs (benchmarks.cache_verify). Not a defence against deliberate tampering: the
    sha256 of checkpoints and records is."""
    import mmap
    import zlib
    from concurrent.futures import ThreadPoolExecutor

    size = Path(path).stat().st_size
    if size == 0:
        return hashlib.sha256(b"").hexdigest()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        try:
            starts = range(0, size, BLOCK)
            if len(starts) == 1:
                crcs = [zlib.crc32(view)]
            else:  # zlib releases the GIL on large buffers; a pool per call: none survives into a fork
                with ThreadPoolExecutor(min(8, os.cpu_count() or 1, len(starts))) as pool:
                    crcs = list(pool.map(lambda i: zlib.crc32(view[i : i + BLOCK]), starts))
        finally:
            view.release()
    return hashlib.sha256(b"".join(c.to_bytes(4, "big") for c in crcs)).hexdigest()


def file_digest(path) -> dict:
    """What a cache entry's digest records of each of its files: size, algorithm and checksum."""
    return {"size": Path(path).stat().st_size, "algorithm": ALGORITHM, "checksum": checksum(path)}


def digest_path(path) -> Path:
    path = Path(path)
    return path.with_name(path.name + DIGEST_SUFFIX)


def write_digest(path, digest: dict | None = None) -> Path:
    """Write the digest file of a finished file `path` (`digest`: its `file_digest`, computed here if not given),
    atomically: `sealed` does it for every cache entry, and files that ship (the embedded checkpoints in
    transferbench/weights) get theirs the same way."""
    side = digest_path(path)
    with atomic_path(side) as tmp:
        tmp.write_text(json.dumps(digest or file_digest(path)))
    return side


_WHOLE: dict = {}  # (path, what each file's size and mtime were) of entries verified in this process
_COMPUTED_IN: dict = {}  # path -> the machine arithmetic digest its digest records (None: none recorded)


def _signature(path: Path, directory: bool) -> tuple:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if directory else [path, digest_path(path)]
    return tuple((str(p), st.st_size, st.st_mtime_ns) for p in files for st in [p.stat()])


def damage(path, *, directory: bool = False) -> str | None:
    """Why the cache entry `path` cannot be trusted, or None when each of its files has the size and checksum
    that its digest (written with it) records. Each entry is hashed once per process while its files keep
    their size and mtime."""
    path = Path(path)
    try:
        sig = _signature(path, directory)
    except FileNotFoundError:
        return "no digest" if not directory else f"a file vanished under {path}"
    if _WHOLE.get(str(path)) == sig:
        return None
    try:
        if directory:
            listed = json.loads((path / MANIFEST).read_text())
            arithmetic = listed.pop("." + ARITHMETIC_KEY, None)
            present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {MANIFEST}
            if set(listed) != present:
                gone, extra = sorted(set(listed) - present), sorted(present - set(listed))
                return ", ".join([*(f"{g} missing" for g in gone), *(f"{x} not in {MANIFEST}" for x in extra)])
            expected = {rel: (path / rel, d) for rel, d in listed.items()}
        else:
            side = json.loads(digest_path(path).read_text())
            expected = {path.name: (path, side)}
            arithmetic = side.get(ARITHMETIC_KEY) if isinstance(side, dict) else None
    except FileNotFoundError:
        return f"no digest ({MANIFEST if directory else digest_path(path).name} missing)"
    except (OSError, ValueError) as e:
        return f"unreadable digest ({e})"
    for rel, (p, d) in expected.items():
        size = p.stat().st_size
        label = f"{rel}: " if directory else ""
        if not isinstance(d, dict) or size != d.get("size"):
            return f"{label}{size:,} bytes, its digest says {d.get('size') if isinstance(d, dict) else d!r}"
        if d.get("algorithm") != ALGORITHM:
            return f"{label}digest of another algorithm ({d.get('algorithm')!r}, not {ALGORITHM!r})"
        if checksum(p) != d.get("checksum"):
            return f"{label}checksum differs from its digest"
    _WHOLE[str(path)] = sig
    _COMPUTED_IN[str(path)] = arithmetic
    return None


def quarantine(path, why: str, what: str = "cache entry") -> Path | None:
    """Set `path` (a file or folder, with its digest file) aside in the `.quarantine` folder beside it,
    renamed, not deleted; one warning line names it, why and where it went. None if it was gone already."""
    path = Path(path)
    stem = path.parent / QUARANTINE / f"{path.name}.{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    dest, n = stem, 0
    while dest.exists():  # set aside twice within a second
        n += 1
        dest = stem.with_name(f"{stem.name}-{n}")
    try:
        dest.parent.mkdir(exist_ok=True)
        os.replace(path, dest)
    except FileNotFoundError:
        return None
    except OSError as e:
        err = write_error(e, dest)
        raise (err or e) from None
    side = digest_path(path)
    if side.exists():
        os.replace(side, digest_path(dest))
    _WHOLE.pop(str(path), None)
    log.warning(
        "transferbench: warning: damaged %s %s (%s): set aside as %s; computing it again", what, path, why, dest
    )
    return dest


# caches whose entries are numbers a model computed: an entry written under another machine's arithmetic is computed
# again here, never read, so that it is never mixed into an exact judgment (docs/reliability.md)
ARITHMETIC_CACHES = ("features", "classifiers", "lit", "corruptions", "decoded", "checkpoints")


def foreign(path) -> str | None:
    """The machine digest that computed the whole entry `path` where it is not this process's and the entry's
    cache holds numbers (ARITHMETIC_CACHES); None where it may be read."""
    if _kind(path) not in ARITHMETIC_CACHES:
        return None
    theirs = _COMPUTED_IN.get(str(path))
    return None if theirs == _computing_arithmetic() else (theirs or "unrecorded")


def verified(path, what: str = "cache entry", *, directory: bool = False) -> bool:
    """Whether the cache entry `path` (a file, or a folder with `directory`) is there, whole and, for a cache of
    numbers (ARITHMETIC_CACHES), computed in this process's arithmetic: one of another arithmetic is a miss, computed
    again and replaced (`sealed`), never read. A damaged one
    (a file of another size or checksum than its digest says, a file missing, no digest at all) is set aside
    (`quarantine`) and False returned, as for a missing one: the caller computes it again. It is checked
    without a lock, and a damaged one again under the entry's lock before it is set aside (a writer may be
    between its two renames)."""
    path = Path(path)
    if not path.exists():
        return False
    if damage(path, directory=directory) is None:
        other = foreign(path)
        if other is not None:
            log.info(
                "transferbench: %s %s was computed in other arithmetic (%s): computing it again", what, path, other
            )
            return False
        _read(path)
        return True
    with entry_lock(path):
        if not path.exists():
            return False
        why = damage(path, directory=directory)
        if why is None and foreign(path) is not None:
            return False
        if why is None:
            _read(path)
            return True
        quarantine(path, why, what)
    return False


def _read(path: Path) -> None:
    """Count a whole entry read, and tell the cell's arithmetic trace which machine computed it."""
    tally(path, "read")
    kind = _kind(path)
    if kind is not None:
        from .arithmetic import note_cache_read

        note_cache_read(kind, _COMPUTED_IN.get(str(path)))


def _computing_arithmetic() -> str:
    from .arithmetic import machine_digest

    return machine_digest()


@contextmanager
def sealed(path, *, suffix: str = "", directory: bool = False) -> Iterator[Path]:
    """`atomic_path` for a cache entry: the entry is written with its digest (a file's beside it as
    NAME.digest, a folder's inside it as MANIFEST.json) and put in place under its lock, only while no whole
    entry is there (the first writer wins: a reader never sees one writer's file with another's digest)."""
    path = Path(path)
    with _aside(path, suffix, directory) as tmp:
        yield tmp
        if directory:
            listed = {p.relative_to(tmp).as_posix(): file_digest(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
            listed["." + ARITHMETIC_KEY] = _computing_arithmetic()
            (tmp / MANIFEST).write_text(json.dumps(listed, indent=1, sort_keys=True))
        else:
            digest = file_digest(tmp)  # before the lock: readers wait no longer than the renames take
            digest[ARITHMETIC_KEY] = _computing_arithmetic()
        tally(path, "computed")
        with entry_lock(path):
            if path.exists() and damage(path, directory=directory) is None and foreign(path) is None:
                return  # another writer's whole entry stays; this one's temporary goes
            _WHOLE.pop(str(path), None)  # an entry of other arithmetic is replaced
            if directory:
                _remove(path)
            os.replace(tmp, path)
            if not directory:  # after the file: a file without its digest is damaged, never trusted
                write_digest(path, digest)
