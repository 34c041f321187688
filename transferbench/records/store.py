"""Records: one JSON file per finished cell, written atomically (temp file + fsync + rename).

Layout: `OUT/<task>/<dataset>/<key>.json`. A record holds the cell's identity and report fields, the
metrics per split (`{"val": {"accuracy": 71.2}, "test": {...}}`), status (ok | diverged | failed),
reason, seconds and environment. Readers ignore temp files, so a killed writer never leaves a torn
record behind.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Iterable

from filelock import FileLock, Timeout

from ..errors import UserError
from ..paths import TMP_MARK, atomic_path

FINISHED = ("ok", "diverged")  # a rerun skips these; failed cells are tried again


class RecordStore:
    def __init__(self, root):
        self.root = Path(root)
        self._finished: dict[Path, dict] = {}  # finished records do not change: planning reads them once


    def path(self, cell) -> Path:
        return self._path(cell.task, cell.dataset, cell.key)

    def _path(self, task: str, dataset: str, key: str) -> Path:
        return self.root / task / dataset / f"{key}.json"

    def get(self, cell) -> dict | None:
        p = self.path(cell)
        if p in self._finished:
            return self._finished[p]
        try:
            rec = json.loads(p.read_text())
        except FileNotFoundError:
            return None
        if rec.get("status") in FINISHED:
            self._finished[p] = rec
        return rec

    def finished(self, cell) -> bool:
        rec = self.get(cell)
        return rec is not None and rec["status"] in FINISHED

    def write(self, record: dict) -> Path:
        p = self._path(record["task"], record["dataset"], record["key"])
        with atomic_path(p) as tmp, open(tmp, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        self._finished.pop(p, None)
        return p

    def write_samples(self, record: dict, samples: dict) -> dict:
        """Per-example results of a cell ({split: array}) as `<key>.samples.npz` beside its record, compressed
        and written atomically; returns what the record says of them (file, splits, lengths, sha256)."""
        import numpy as np
        p = self._path(record["task"], record["dataset"], record["key"]).with_suffix(".samples.npz")
        arrays = {split: np.asarray(a) for split, a in samples.items()}
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        data = buf.getvalue()  # hashed as written: the file is never read back
        with atomic_path(p) as tmp, open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return {"file": p.name, "splits": {k: int(a.size) for k, a in arrays.items()},
                "sha256": hashlib.sha256(data).hexdigest()}

    def lock(self, cell) -> FileLock:
        """An OS lock per cell (released by the kernel if its holder is killed): two runs into one
        folder never compute or write the same cell at once."""
        d = self.root / ".locks"
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / f"{cell.key}.lock"))

    def remove_stale_temps(self) -> int:
        """Temp files whose writer is gone (killed mid-write). Returns how many were removed."""
        removed = 0
        for p in self.root.rglob(f".*.json{TMP_MARK}*"):
            pid = p.name.rsplit(TMP_MARK, 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                p.unlink(missing_ok=True)
                removed += 1
        return removed


def read_samples(record: dict, split: str = "test"):
    """The per-example results of `split` that a record loaded by `load_records` logged, or None (none logged,
    the file missing or not the one the record names: a damaged file is never trusted)."""
    import numpy as np
    meta = record.get("samples")
    if not meta or "_file" not in record or split not in meta.get("splits", {}):
        return None
    p = Path(record["_file"]).with_name(meta["file"])
    try:
        data = p.read_bytes()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        return None
    with np.load(io.BytesIO(data)) as z:
        return z[split] if split in z.files else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_records(dirs: Iterable) -> list[dict]:
    """Every record under the given folders (recursively), in a stable order."""
    out = []
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise UserError(f"records folder {d} does not exist (give the --out folder of a `transferbench run`)")
        for p in sorted(d.rglob("*.json")):
            if p.name.startswith("."):
                continue
            try:
                rec = json.loads(p.read_text())
            except json.JSONDecodeError as e:
                raise UserError(f"{p} is not a valid record ({e}); delete it and rerun to recompute that cell") from None
            if isinstance(rec, dict) and "key" in rec and "status" in rec:
                rec["_file"] = str(p)  # where it was read (its samples lie beside it); never written back
                out.append(rec)
    return out


__all__ = ["FINISHED", "RecordStore", "Timeout", "load_records", "read_samples"]
