"""How a cache entry under $TRANSFERBENCH_HOME is trusted. It is written with its digest (each file's size and
checksum, and the machine arithmetic that computed it) and put in place under its lock (`sealed`); it is checked
before it is read (`verified`); a damaged one is set aside, never read (`quarantine`). An entry of a cache of
numbers (`ARITHMETIC_CACHES`) that another machine's arithmetic computed is computed again, never read. What the
checks found, and the entries read and computed, go into the ledger held in this process (`paths.ledger`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .home import cache_of
from .ledger import Ledger, held_ledger
from .writes import aside, atomic_path, remove, write_error

log = logging.getLogger("transferbench")

QUARANTINE = ".quarantine"  # damaged entries and records are renamed into this folder beside them
DIGEST_SUFFIX = ".digest"  # a file entry's digest, beside it: {"size", "algorithm", "checksum"} (file_digest)
MANIFEST = "MANIFEST.json"  # a folder entry's digest, inside it: {relative path: file_digest}
ARITHMETIC_KEY = "arithmetic"  # in a file's digest, and as ".arithmetic" in a MANIFEST: the machine that computed it
# caches whose entries are numbers a model computed: an entry written under another machine's arithmetic is computed
# again here, never read, so that it is never mixed into an exact judgment (docs/reliability.md)
ARITHMETIC_CACHES = ("features", "classifiers", "lit", "corruptions", "decoded", "checkpoints")


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


def _signature(path: Path, directory: bool) -> tuple:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if directory else [path, digest_path(path)]
    return tuple((str(p), st.st_size, st.st_mtime_ns) for p in files for st in [p.stat()])


def damage(path, *, directory: bool = False) -> str | None:
    """Why the cache entry `path` cannot be trusted, or None when each of its files has the size and checksum
    that its digest (written with it) records. Each entry is hashed once per ledger (`paths.ledger`: once per run
    in a process) while its files keep their size and mtime."""
    return _damage(Path(path), directory, held_ledger())


def _damage(path: Path, directory: bool, ledger: Ledger) -> str | None:
    try:
        sig = _signature(path, directory)
    except FileNotFoundError:
        return "no digest" if not directory else f"a file vanished under {path}"
    if ledger.whole.get(str(path)) == sig:
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
    ledger.whole[str(path)] = sig
    ledger.computed_in[str(path)] = arithmetic
    return None


def quarantine(path, why: str, what: str = "cache entry") -> Path | None:
    """Set `path` (a file or folder, with its digest file) aside in the `.quarantine` folder beside it,
    renamed, not deleted; one warning line names it, why and where it went. None if it was gone already."""
    return _quarantine(Path(path), why, what, held_ledger())


def _quarantine(path: Path, why: str, what: str, ledger: Ledger) -> Path | None:
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
    ledger.whole.pop(str(path), None)
    log.warning(
        "transferbench: warning: damaged %s %s (%s): set aside as %s; computing it again", what, path, why, dest
    )
    return dest


def _foreign(path: Path, ledger: Ledger) -> str | None:
    """The machine digest that computed the whole entry `path` where it is not this process's and the entry's
    cache holds numbers (ARITHMETIC_CACHES); None where it may be read."""
    if cache_of(path) not in ARITHMETIC_CACHES:
        return None
    theirs = ledger.computed_in.get(str(path))
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
    ledger = held_ledger()
    if _damage(path, directory, ledger) is None:
        other = _foreign(path, ledger)
        if other is not None:
            log.info(
                "transferbench: %s %s was computed in other arithmetic (%s): computing it again", what, path, other
            )
            return False
        _read(path, ledger)
        return True
    with entry_lock(path):
        if not path.exists():
            return False
        why = _damage(path, directory, ledger)
        if why is None and _foreign(path, ledger) is not None:
            return False
        if why is None:
            _read(path, ledger)
            return True
        _quarantine(path, why, what, ledger)
    return False


def _read(path: Path, ledger: Ledger) -> None:
    """Count a whole entry read, and tell the cell's arithmetic trace which machine computed it."""
    ledger.count(path, "read")
    kind = cache_of(path)
    if kind is not None:
        from ..arithmetic import note_cache_read

        note_cache_read(kind, ledger.computed_in.get(str(path)))


def _computing_arithmetic() -> str:
    from ..arithmetic import machine_digest

    return machine_digest()


@contextmanager
def sealed(path, *, suffix: str = "", directory: bool = False) -> Iterator[Path]:
    """`atomic_path` for a cache entry: the entry is written with its digest (a file's beside it as
    NAME.digest, a folder's inside it as MANIFEST.json) and put in place under its lock, only while no whole
    entry is there (the first writer wins: a reader never sees one writer's file with another's digest)."""
    path = Path(path)
    with aside(path, suffix, directory) as tmp:
        yield tmp
        if directory:
            listed = {p.relative_to(tmp).as_posix(): file_digest(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
            listed["." + ARITHMETIC_KEY] = _computing_arithmetic()
            (tmp / MANIFEST).write_text(json.dumps(listed, indent=1, sort_keys=True))
        else:
            digest = file_digest(tmp)  # before the lock: readers wait no longer than the renames take
            digest[ARITHMETIC_KEY] = _computing_arithmetic()
        ledger = held_ledger()
        ledger.count(path, "computed")
        with entry_lock(path):
            if path.exists() and _damage(path, directory, ledger) is None and _foreign(path, ledger) is None:
                return  # another writer's whole entry stays; this one's temporary goes
            ledger.whole.pop(str(path), None)  # an entry of other arithmetic is replaced
            if directory:
                remove(path)
            os.replace(tmp, path)
            if not directory:  # after the file: a file without its digest is damaged, never trusted
                write_digest(path, digest)
