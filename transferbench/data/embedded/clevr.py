"""CLEVR-style rendered scenes (`clevr_count`, `clevr_dist`) with VTAB's label rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..folder import write_folder_dataset
from ..labels import CLEVR_DIST_THRESHOLDS, clevr_count_label, clevr_dist_label
from .common import N_TEST, N_TRAIN, N_VAL, _info, _slices

CLEVR_COLOURS = np.array(
    [
        [87, 87, 87],
        [173, 35, 35],
        [42, 75, 215],
        [29, 105, 20],
        [129, 74, 25],
        [129, 38, 192],
        [41, 208, 208],
        [255, 238, 51],
    ],
    dtype=np.float32,
)


def render_scene(objects: list[tuple[float, float, int, int, float]], size: int = 64) -> np.ndarray:
    """objects: (lateral x, depth z, colour, shape 0 sphere / 1 cube, radius). Perspective: image row and
    size follow 1/z; drawn far to near."""
    v, u = np.mgrid[:size, :size] + 0.5
    img = np.empty((size, size, 3), np.float32)
    img[:] = (110 + 60 * (v / size))[..., None]  # floor, lighter towards the camera
    f, horizon, cam_h = size * 1.4, size * 0.05, 3.0
    for x, z, colour, shape, radius in sorted(objects, key=lambda o: -o[1]):
        cu, cv, r = size / 2 + f * x / z, horizon + f * cam_h / z, f * radius / z
        if shape == 0:
            d2 = ((u - cu) ** 2 + (v - cv) ** 2) / r**2
            mask = d2 <= 1
            shade = 0.55 + 0.45 * np.sqrt(np.clip(1 - d2, 0, 1))
        else:
            mask = (np.abs(u - cu) <= r) & (np.abs(v - cv) <= r)
            shade = 0.8 + 0.2 * ((u - cu) < 0)
        img[mask] = CLEVR_COLOURS[colour] * np.asarray(shade if np.ndim(shade) == 0 else shade[mask])[..., None]
    return np.clip(img, 0, 255).astype(np.uint8)


def sample_scene(rng: np.random.Generator) -> tuple[list, int, float]:
    """3..10 objects; the closest object's depth is drawn class-balanced over the distance bins."""
    n = int(rng.integers(3, 11))
    cls = int(rng.integers(0, len(CLEVR_DIST_THRESHOLDS) - 1))
    lo, hi = max(CLEVR_DIST_THRESHOLDS[cls], 7.0), min(CLEVR_DIST_THRESHOLDS[cls + 1], 12.5)
    z_min = float(rng.uniform(lo + 1e-3, hi))
    depths = [z_min] + list(rng.uniform(z_min, 14.0, n - 1))
    objs = [
        (
            float(rng.uniform(-2.8, 2.8)),
            float(z),
            int(rng.integers(0, 8)),
            int(rng.integers(0, 2)),
            float(rng.choice([0.45, 0.7])),
        )
        for z in depths
    ]
    return objs, n, z_min


def gen_clevr(root: Path, seed: int) -> None:
    rng = np.random.default_rng([seed, 6])
    n = N_TRAIN + N_VAL + N_TEST
    scenes = [sample_scene(rng) for _ in range(n)]
    imgs = [render_scene(objs) for objs, _, _ in scenes]
    for name, label in (
        ("clevr_count", lambda s: clevr_count_label(s[1])),
        ("clevr_dist", lambda s: clevr_dist_label([o[1] for o in s[0]])),
    ):
        items = [(imgs[i], label(scenes[i])) for i in range(n)]
        write_folder_dataset(
            root,
            name,
            _slices(items),
            _info(name, seed, 8 if name == "clevr_count" else 6, "procedural CLEVR-style scenes"),
        )


# --- upstream: procedural glyphs -----------------------------------------------------------------
