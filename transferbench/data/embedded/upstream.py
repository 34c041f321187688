"""The upstream pretraining set: glyph, texture, photograph and position classes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image

from ..folder import write_folder_dataset
from .common import (
    N_GLYPHS,
    N_PHOTOS,
    N_QUARTERS,
    N_TEXTURES,
    N_UPSTREAM,
    N_UPSTREAM_TEST,
    UPSTREAM_PHOTOS,
    UPSTREAM_ROWS,
    _info,
    load_photo,
    photo_patch,
)


def glyph_strokes(num_classes: int, seed: int) -> list[np.ndarray]:
    """Each class: 2-4 strokes (polylines through points of a 5 x 5 lattice), as segment arrays."""
    rng = np.random.default_rng([seed, 7])
    classes = []
    for _ in range(num_classes):
        segs = []
        for _ in range(int(rng.integers(2, 5))):
            pts = rng.integers(0, 5, size=(int(rng.integers(2, 4)), 2)) / 4.0 - 0.5
            segs += [np.concatenate([pts[i], pts[i + 1]]) for i in range(len(pts) - 1)]
        classes.append(np.array(segs, np.float32))
    return classes


def glyph_ink(
    segs: np.ndarray, rng: np.random.Generator, size: int = 32, scale=(0.6, 0.9), centre=(0.5, 0.5)
) -> np.ndarray:
    """The ink (size x size, 0..1) of a glyph's strokes under random rotation, scale (a fraction of the image), shift
    (+-0.1 of the image around `centre`, fractions (x, y)) and stroke width."""
    theta, scale = rng.uniform(-0.35, 0.35), rng.uniform(*scale) * size
    shift = (rng.uniform(-0.1, 0.1, 2) + np.asarray(centre)) * size
    c, s = math.cos(theta), math.sin(theta)
    rot = np.array([[c, -s], [s, c]], np.float32) * scale
    a, b = segs[:, :2] @ rot.T + shift, segs[:, 2:] @ rot.T + shift
    v, u = np.mgrid[:size, :size] + 0.5
    p = np.stack([u, v], -1).reshape(-1, 1, 2)
    ab = b - a
    t = np.clip(((p - a) * ab).sum(-1) / np.maximum((ab * ab).sum(-1), 1e-6), 0, 1)
    dist = np.linalg.norm(p - (a + t[..., None] * ab), axis=-1).min(1).reshape(size, size)
    return np.clip(rng.uniform(1.0, 2.0) * size / 32 - dist + 0.5, 0, 1)


def render_glyph(
    segs: np.ndarray, rng: np.random.Generator, size: int = 32, scale=(0.6, 0.9), centre=(0.5, 0.5)
) -> np.ndarray:
    """Light strokes (`glyph_ink`) on a dark ground (one polarity, as handwriting scans), random tints. Version 2
    also inverted the polarity and added shaded, noisy grounds; a mu ViT did not leave chance level on it in 48k
    images."""
    ink = glyph_ink(segs, rng, size, scale, centre)[..., None]
    ground, colour = rng.uniform(0, 60, 3), rng.uniform(170, 255, 3)
    return np.clip(ground * (1 - ink) + colour * ink, 0, 255).astype(np.uint8)


def texture_classes(num_classes: int, seed: int) -> list[dict]:
    """Each class: a palette of two colours, a pattern kind and a period (pixels at 32 px) and angle."""
    rng = np.random.default_rng([seed, 9])
    return [
        {
            "colours": rng.uniform(0, 255, (2, 3)),
            "kind": k % len(TEXTURE_KINDS),
            "period": float(rng.uniform(5.0, 14.0)),
            "angle": float(rng.uniform(0, math.pi)),
        }
        for k in range(num_classes)
    ]


TEXTURE_KINDS = ("stripes", "checks", "blobs", "dots")


def render_texture(cls: dict, rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """The class's pattern mixes its two colours; phase, angle (+-0.3 rad), period (x0.85-1.15), colours
    (+-20 per channel) and pixel noise vary per image, so colour and frequency are what identify a class."""
    v, u = np.mgrid[:size, :size] + 0.5
    theta = cls["angle"] + rng.uniform(-0.3, 0.3)
    period = cls["period"] * rng.uniform(0.85, 1.15)
    a = (u * math.cos(theta) + v * math.sin(theta)) * 2 * math.pi / period + rng.uniform(0, 2 * math.pi)
    b = (-u * math.sin(theta) + v * math.cos(theta)) * 2 * math.pi / period + rng.uniform(0, 2 * math.pi)
    kind = TEXTURE_KINDS[cls["kind"]]
    if kind == "stripes":
        mask = 0.5 + 0.5 * np.sin(a)
    elif kind == "checks":
        mask = (np.sin(a) * np.sin(b) > 0).astype(np.float64)
    elif kind == "dots":
        mask = ((np.cos(a) + np.cos(b)) > 1.2).astype(np.float64)
    else:  # blobs: low-pass noise at the class period
        k = max(1, int(round(size / period)))
        coarse = rng.normal(size=(k + 1, k + 1))
        mask = np.asarray(Image.fromarray(coarse.astype(np.float32)).resize((size, size), Image.BICUBIC))
        mask = 1 / (1 + np.exp(-3 * mask))
    colours = np.clip(cls["colours"] + rng.uniform(-20, 20, (2, 3)), 0, 255)
    img = colours[0] * (1 - mask[..., None]) + colours[1] * mask[..., None] + rng.normal(0, 6, (size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


POSITION_GRID = 4  # position classes: a small glyph of any class in one cell of a 4 x 4 grid
N_POSITIONS = POSITION_GRID**2


def position_centre(k: int) -> tuple[float, float]:
    """The centre (x, y), as fractions of the image, of position class k's cell (row-major)."""
    row, col = divmod(k, POSITION_GRID)
    return (col + 0.5) / POSITION_GRID, (row + 0.5) / POSITION_GRID


N_PHOTO_CLASSES = N_PHOTOS * N_QUARTERS  # photograph k, column quarter q: class N_GLYPHS + N_TEXTURES + 4k + q
N_UPSTREAM_CLASSES = N_GLYPHS + N_TEXTURES + N_PHOTO_CLASSES + N_POSITIONS


def photo_class_region(j: int) -> tuple[int, tuple[float, float], tuple[float, float]]:
    """Photograph class j (0-based among the photograph classes): (the photograph's index in UPSTREAM_PHOTOS, its
    column range, its row range), as fractions of the photograph's width and height."""
    k, q = divmod(j, N_QUARTERS)
    return k, (q / N_QUARTERS, (q + 1) / N_QUARTERS), (0.0, UPSTREAM_ROWS)


def gen_upstream(root: Path, seed: int) -> None:
    """Each group keeps features that the frozen few-shot probe needs and the others would let the
    network drop: glyphs teach strokes and shapes; textures keep colour and frequency, which
    tinted glyphs alone taught it to ignore (v3: `photos` fell to half of random init's accuracy);
    photographs keep natural colour statistics (v4, without them: `photos` 6 to 12 points below random
    init); positions keep where things lie, which shift-jittered classes teach it to discard (v4:
    `clevr_dist`, read off the lowest object's row, 3 to 8 points below random init). Counting classes
    (1 to 8 objects) were tried with v3 and made upstream accuracy fall to 67%. v6 splits each photograph into
    its four column quarters, a class each (16 photograph classes became 64: `photos` went from 7.0 below random
    init to 3.7 above it with mu4), and cuts them from the top 65% of its rows only: `scenes` cuts its stuff
    regions from the rest, so no pixel of a scene is in the upstream set."""
    glyphs, textures = glyph_strokes(N_GLYPHS, seed), texture_classes(N_TEXTURES, seed)
    photos = [load_photo(*p) for p in UPSTREAM_PHOTOS]
    rng = np.random.default_rng([seed, 8])
    labels = rng.integers(0, N_UPSTREAM_CLASSES, N_UPSTREAM + N_UPSTREAM_TEST)

    def render(k: int) -> np.ndarray:
        if k < N_GLYPHS:
            return render_glyph(glyphs[k], rng)
        if k < N_GLYPHS + N_TEXTURES:
            return render_texture(textures[k - N_GLYPHS], rng)
        if k < N_GLYPHS + N_TEXTURES + N_PHOTO_CLASSES:
            i, x_range, y_range = photo_class_region(k - N_GLYPHS - N_TEXTURES)
            return photo_patch(photos[i], rng, x_range=x_range, y_range=y_range)
        centre = position_centre(k - N_GLYPHS - N_TEXTURES - N_PHOTO_CLASSES)
        return render_glyph(glyphs[int(rng.integers(N_GLYPHS))], rng, scale=(0.25, 0.35), centre=centre)

    items = [(render(int(k)), int(k)) for k in labels]
    write_folder_dataset(
        root,
        "upstream",
        {"train": items[:N_UPSTREAM], "test": items[N_UPSTREAM:]},
        _info(
            "upstream",
            seed,
            N_UPSTREAM_CLASSES,
            "procedural glyphs (random strokes, affine "
            "jitter, light tinted strokes on dark tinted grounds) and procedural two-colour "
            "textures (stripes, checks, blobs, dots); patches of the column quarters of photographs that "
            "scikit-learn, matplotlib and scikit-image ship (not those of `photos`), from the top 65% of their "
            "rows; where a small glyph lies (a 4 x 4 grid)",
        ),
    )


# --- segmentation: textured objects on photographs ------------------------------------------------
