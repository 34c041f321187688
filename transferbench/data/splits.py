"""tfds split strings resolved to example indices, by transferbench itself (pure, testable).

`train[:800]+train[45000:45200]`, `train[50%:]`, `test[:200]`, `validation` — the grammar of
tfds.Split slicing: absolute or percent bounds, negative bounds from the end, `+` concatenates.
Percent bounds round to the closest example as tfds does by default: int(round(pct * n / 100)).
We resolve on indices because `tfds.data_source` gives random access and `tfds.testing.mock_data`
ignores slicing.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import UserError

_PART = re.compile(r"^(?P<split>[\w/-]+)(?:\[(?P<start>[-\d.]*%?)?:(?P<stop>[-\d.]*%?)?\])?$")


def _bound(text: str | None, n: int, default: int) -> int:
    if not text:
        return default
    if text.endswith("%"):
        value = int(round(float(text[:-1]) * n / 100.0))
    else:
        value = int(text)
    if abs(value) > n:
        raise UserError(f"slice bound {text} is outside a split of {n} examples")
    return value + n if value < 0 else value


def resolve_split(spec: str, lengths: dict[str, int]) -> list[tuple[str, np.ndarray]]:
    """'train[:800]+validation[:200]' -> [('train', [0..799]), ('validation', [0..199])]."""
    parts = []
    for piece in re.split(r"\s*\+\s*", spec.strip()):
        m = _PART.match(piece)
        if not m:
            raise UserError(f"cannot parse split {piece!r} in {spec!r}; expected e.g. train[:800] or train[50%:]")
        split = m["split"]
        if split not in lengths:
            raise UserError(f"split {split!r} (in {spec!r}) does not exist; splits: {', '.join(sorted(lengths))}")
        n = lengths[split]
        start, stop = _bound(m["start"], n, 0), _bound(m["stop"], n, n)
        parts.append((split, np.arange(start, max(start, stop), dtype=np.int64)))
    return parts


def split_size(spec: str, lengths: dict[str, int]) -> int:
    return sum(len(idx) for _, idx in resolve_split(spec, lengths))
