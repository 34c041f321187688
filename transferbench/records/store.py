"""Records: one JSON file per finished cell, written atomically (temp file + fsync + rename).

Layout: `OUT/<task>/<dataset>/<key>.json`. A record holds the cell's identity and report fields, the
metrics per split (`{"val": {"accuracy": 71.2}, "test": {...}}`), status (ok | diverged | failed),
reason, seconds and environment. Readers ignore temp files, so a killed writer never leaves a torn
record behind. A record torn some other way (a bad copy, a damaged disk) is never trusted: a run sets it
aside into `.quarantine/` beside it and computes its cell again; the readers of reports skip it with one
warning line (or stop on it, `strict`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import UserError
from ..paths.entries import quarantine
from ..paths.portable import portable
from ..paths.writes import atomic_path, remove_stale_temps
from .record import Record

log = logging.getLogger("transferbench")

FINISHED = ("ok", "diverged")  # a rerun skips these; failed cells are tried again
# 2: schema_version, checkpoint paths never absolute (paths.portable), metrics without float noise, the environment
# with torchvision, open_clip, CUDA/cuDNN, the data packages and a dirty flag. A record without the field is 1.
SCHEMA_VERSION = 2
RESULTS_FILE = "results.json"  # a run's summary beside its task's records (cli), not a record


def tidy(value: float) -> float:
    """A metric as a record stores it: 15 significant digits, the most a decimal keeps through a float, so that
    the noise of the 16th and 17th (57.699999999999996) goes and nothing a metric resolves is lost."""
    return float(f"{value:.15g}")


def record_of(cell, outcome: dict, run_id: str, config: dict | None = None) -> Record:
    """A finished cell's record (schema SCHEMA_VERSION): the cell's fields and key, its outcome (status, metrics,
    info, seconds, environment, fingerprint, arithmetic and outputs digests (transferbench.arithmetic), caches),
    the run and the command that made it."""
    record = {
        "schema_version": SCHEMA_VERSION,
        **cell.to_dict(),
        "checkpoint": portable(cell.checkpoint),  # this machine's path stays out of the record
        "key": cell.key,
        "status": outcome["status"],
        "reason": outcome["reason"],
        "metrics": {split: {k: tidy(v) for k, v in m.items()} for split, m in outcome["metrics"].items()},
        "info": outcome["info"],
        "seconds": outcome["seconds"],
        "run_id": run_id,
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "environment": outcome["environment"],
        "fingerprint": outcome.get("fingerprint"),
        "arithmetic": outcome.get("arithmetic"),
        "outputs": outcome.get("outputs"),
        "caches": outcome.get("caches") or {},
        "argv": sys.argv[1:],
        **({"config": config} if config else {}),
    }
    if outcome.get("traceback"):
        record["traceback"] = outcome["traceback"]
    return record


def schema_version(record: dict) -> int:
    return int(record.get("schema_version", 1))


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
            rec = read_record(p)
        except FileNotFoundError:
            return None
        except ValueError as e:  # torn: as if it were missing, set aside where a user can still look at it
            quarantine(p, f"not a valid record: {e}", "record")
            return None
        if rec.get("status") in FINISHED:
            self._finished[p] = rec
        return rec

    def finished(self, cell) -> bool:
        rec = self.get(cell)
        return rec is not None and rec["status"] in FINISHED

    def write(self, record: dict) -> Path:
        p = self._path(record["task"], record["dataset"], record["key"])
        data = json.dumps(record, indent=1, sort_keys=True, default=str).encode()
        self._write_bytes(p, data, "record")
        self._finished.pop(p, None)
        return p

    @staticmethod
    def _write_bytes(p: Path, data: bytes, what: str) -> None:
        """`data` as file `p`, atomically and synced; a refused write (full disk, read-only) is one UserError
        naming the file and the bytes needed, with no temporary left behind."""
        with atomic_path(p, needed=len(data), what=what) as tmp, open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def write_samples(self, record: dict, samples: dict) -> dict:
        """Per-example results of a cell ({split: array}) as `<key>.samples.npz` beside its record, compressed
        and written atomically; returns what the record says of them (file, splits, lengths, sha256)."""
        import numpy as np

        p = self._path(record["task"], record["dataset"], record["key"]).with_suffix(".samples.npz")
        arrays = {split: np.asarray(a) for split, a in samples.items()}
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        data = buf.getvalue()  # hashed as written: the file is never read back
        self._write_bytes(p, data, "per-example results")
        return {
            "file": p.name,
            "splits": {k: int(a.size) for k, a in arrays.items()},
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    def lock(self, cell) -> FileLock:
        """An OS lock per cell (released by the kernel if its holder is killed): two runs into one
        folder never compute or write the same cell at once."""
        d = self.root / ".locks"
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / f"{cell.key}.lock"))

    def remove_stale_temps(self) -> int:
        """Temp files whose writer is gone (killed mid-write). Returns how many were removed."""
        return remove_stale_temps(self.root)


def read_samples(record: Record, split: str = "test"):
    """The per-example results of `split` that a record loaded by `load_records` logged, or None (none logged,
    the file missing or not the one the record names: a damaged file is never trusted)."""
    import numpy as np

    meta = record.get("samples")
    if not meta or "_file" not in record or split not in meta.get("splits", {}):
        return None
    p = Path(record["_file"]).with_name(meta["file"])
    try:
        data = p.read_bytes()
    except OSError as e:
        log.warning(
            "transferbench: warning: per-example results %s unreadable (%s); the cell is compared by its seeds only",
            p,
            e.strerror or e,
        )
        return None
    if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        log.warning(
            "transferbench: warning: per-example results %s do not match the sha256 in their record; "
            "the cell is compared by its seeds only (rerun it with --force --log-samples to write them "
            "again)",
            p,
        )
        return None
    with np.load(io.BytesIO(data)) as z:
        return z[split] if split in z.files else None


def parse_record(data: bytes) -> dict:
    """A record file's content as a dict, or ValueError saying why it is not a record (torn, not JSON, not a
    record's fields)."""
    try:
        rec = json.loads(data)
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{e.msg}: line {e.lineno} column {e.colno} of {len(data):,} bytes") from None
    if not isinstance(rec, dict) or not {"key", "status", "task", "dataset"} <= set(rec):
        raise ValueError("JSON without a record's key, status, task and dataset")
    return rec


def read_record(p: Path) -> dict:
    """The record in file `p`: ValueError when it is not one (`parse_record`), FileNotFoundError when it is gone,
    one UserError when it cannot be read at all."""
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UserError(f"cannot read record {p} ({e.strerror or e}); check the folder's permissions") from None
    return parse_record(data)


def check_folder(d: Path, name: str = "records folder") -> None:
    """One UserError where `d` is not a folder of records (a file, or nothing), naming it as `name` (a flag)."""
    if not d.is_dir():
        what = "is a file, not a records folder" if d.exists() else "does not exist"
        raise UserError(f"{name} {d} {what} (give the --out folder of a `transferbench run` or `nightly`)")


def load_records(dirs: Iterable, *, strict: bool = False) -> list[Record]:
    """Every record under the given folders (recursively), in a stable order. A file that is not a valid
    record is skipped with one warning line (`transferbench run` into its folder sets it aside and computes
    its cell again), or with `strict` stops with a one-line UserError. Set-aside and temporary files (under
    dot-named folders, or dot-named) are not read."""
    out = []
    for d in dirs:
        d = Path(d)
        check_folder(d)
        for p in sorted(d.rglob("*.json")):
            if any(part.startswith(".") for part in p.relative_to(d).parts) or p.name == RESULTS_FILE:
                continue
            try:
                rec = read_record(p)
            except ValueError as e:
                if strict:
                    raise UserError(
                        f"{p} is not a valid record ({e}); rerun the `transferbench run` that wrote it "
                        "(it sets the file aside and computes that cell again), or drop --strict to "
                        "skip it"
                    ) from None
                log.warning(
                    "transferbench: warning: skipping %s: not a valid record (%s); a rerun of the "
                    "`transferbench run` that wrote it sets it aside and computes that cell again",
                    p,
                    e,
                )
                continue
            rec["_file"] = str(p)  # where it was read (its samples lie beside it); never written back
            out.append(rec)
    return out


__all__ = [
    "FINISHED",
    "SCHEMA_VERSION",
    "record_of",
    "RecordStore",
    "Timeout",
    "load_records",
    "parse_record",
    "read_samples",
    "schema_version",
    "tidy",
]
