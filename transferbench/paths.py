"""Where transferbench writes besides --out: every cache folder under $TRANSFERBENCH_HOME, named here once,
and the one way a file or folder is written there (aside, then renamed into place)."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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
}
TMP_MARK = ".tmp"  # temporary names are '.NAME.tmpPID[suffix]': a reader skips dot files


def home() -> Path:
    """$TRANSFERBENCH_HOME, default ~/.cache/transferbench."""
    return Path(os.environ.get("TRANSFERBENCH_HOME", "~/.cache/transferbench")).expanduser()


def cache(name: str) -> Path:
    """The folder of one cache (not created)."""
    if name not in CACHES:
        raise KeyError(f"no cache folder {name!r}; caches: {', '.join(CACHES)}")
    return home() / name


def temp_path(path: Path, suffix: str = "") -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}{suffix}")


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


@contextmanager
def atomic_path(path, *, suffix: str = "", directory: bool = False) -> Iterator[Path]:
    """Write `path` aside and rename it into place: a reader sees the old content or the new, never a torn one,
    and a killed writer leaves only a dot-named temporary. Yields the temporary path (a new empty folder with
    `directory`; `suffix` keeps an extension that a writer insists on, as numpy's savez does)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path, suffix)
    _remove(tmp)
    if directory:
        tmp.mkdir()
    try:
        yield tmp
        if directory:
            _remove(path)  # a folder is not replaced by rename while it has files
        os.replace(tmp, path)
    finally:
        _remove(tmp)
