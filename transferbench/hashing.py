"""Content keys and file digests: what every cell key and every cache key is made of."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path


def canon(d) -> str:
    """The canonical JSON text of `d` (sorted keys, no spaces; other objects by their str)."""
    return json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)


def digest(d, length: int = 24) -> str:
    """A content key: the first `length` hex digits of the sha256 of `canon(d)` (cells, caches)."""
    return hashlib.sha256(canon(d).encode()).hexdigest()[:length]


def sha256_file(path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path) -> str:
    """sha256_file, remembered per (path, size, mtime) for the life of the process: checkpoints are hashed
    by every cell that names them, and a changed file changes its size or mtime."""
    p = Path(path).resolve()
    st = p.stat()
    return _sha256_cached(str(p), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)  # size and mtime only key the cache
