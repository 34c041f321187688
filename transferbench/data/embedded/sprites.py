"""dSprites-style sprites (`dsprites_loc`, `dsprites_ori`) with VTAB's 16-bin label rules."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..folder import write_folder_dataset
from ..labels import DSPRITES_ORIENTATIONS, DSPRITES_POSITIONS, binned
from .common import N_TEST, N_TRAIN, N_VAL, _info, _slices


def render_sprite(shape: int, scale: float, theta: float, px: int, py: int, size: int = 64) -> np.ndarray:
    """Binary sprite as dSprites draws it: square, ellipse or heart, rotated, scaled and placed on a
    32 x 32 lattice of positions."""
    cx = size * (0.125 + 0.75 * px / (DSPRITES_POSITIONS - 1))
    cy = size * (0.125 + 0.75 * py / (DSPRITES_POSITIONS - 1))
    v, u = np.mgrid[:size, :size] + 0.5
    du, dv = (u - cx) / (scale * size * 0.17), (v - cy) / (scale * size * 0.17)
    c, s = math.cos(theta), math.sin(theta)
    x, y = c * du + s * dv, -s * du + c * dv
    if shape == 0:
        inside = np.maximum(np.abs(x), np.abs(y)) <= 0.8
    elif shape == 1:
        inside = (x / 1.2) ** 2 + (y / 0.5) ** 2 <= 1
    else:
        xx, yy = x * 0.9, -y * 0.9 + 0.2
        inside = (xx**2 + yy**2 - 1) ** 3 - xx**2 * yy**3 <= 0
    return (inside * 255).astype(np.uint8)


def gen_dsprites(root: Path, seed: int) -> None:
    rng = np.random.default_rng([seed, 4])
    n = N_TRAIN + N_VAL + N_TEST
    latents = dict(
        shape=rng.integers(0, 3, n),
        scale=rng.choice(np.linspace(0.5, 1.0, 6), n),
        ori=rng.integers(0, DSPRITES_ORIENTATIONS, n),
        x=rng.integers(0, DSPRITES_POSITIONS, n),
        y=rng.integers(0, DSPRITES_POSITIONS, n),
    )
    imgs = [
        render_sprite(
            latents["shape"][i],
            latents["scale"][i],
            2 * math.pi * latents["ori"][i] / DSPRITES_ORIENTATIONS,
            latents["x"][i],
            latents["y"][i],
        )
        for i in range(n)
    ]
    order = np.random.default_rng([seed, 5]).permutation(n)
    for name, key, num_values in (
        ("dsprites_loc", "x", DSPRITES_POSITIONS),
        ("dsprites_ori", "ori", DSPRITES_ORIENTATIONS),
    ):
        items = [(imgs[i], binned(int(latents[key][i]), num_values)) for i in order]
        write_folder_dataset(
            root,
            name,
            _slices(items),
            _info(name, seed, 16, "procedural dSprites-style sprites", label=f"floor({key} / ({num_values}/16))"),
        )


# --- CLEVR-style scenes --------------------------------------------------------------------------
