"""$TRANSFERBENCH_HOME and every cache folder under it, named here once (`CACHES`)."""

from __future__ import annotations

import os
from pathlib import Path

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


def home() -> Path:
    """$TRANSFERBENCH_HOME, default ~/.cache/transferbench."""
    return Path(os.environ.get(HOME_VARIABLE, DEFAULT_HOME)).expanduser()


def cache(name: str) -> Path:
    """The folder of one cache (not created)."""
    if name not in CACHES:
        raise KeyError(f"no cache folder {name!r}; caches: {', '.join(CACHES)}")
    return home() / name


def cache_of(path) -> str | None:
    """The cache folder that `path` lies in, or None outside the home's caches."""
    try:
        kind = Path(path).resolve().relative_to(home().resolve()).parts[0]
    except (ValueError, IndexError):
        return None
    return kind if kind in CACHES else None


def home_words() -> str:
    """Where the home is, as an error line names it: `$TRANSFERBENCH_HOME=PATH`, or the default where it is unset."""
    return (
        f"${HOME_VARIABLE}={os.environ[HOME_VARIABLE]}"
        if os.environ.get(HOME_VARIABLE)
        else f"${HOME_VARIABLE} (unset: {DEFAULT_HOME})"
    )
