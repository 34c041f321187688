"""`scenes`: segmentation scenes of textured objects on photographs, in the ADE20K mask convention."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..folder import write_folder_dataset
from .common import PHOTOS, _info, load_photo, photo_patch
from .upstream import TEXTURE_KINDS, render_texture

SCENE_SIZE = (48, 72)  # (height, width): not square, so the test-time resize and sliding windows matter
N_SCENES_TRAIN, N_SCENES_VAL = 512, 128
SCENE_KINDS = ("stripes", "checks", "dots")  # of TEXTURE_KINDS; blobs looked too much like the photographs
SCENE_CLASSES = ("background", *SCENE_KINDS)  # train ids 0..3; stored +1, 0 = boundary (ignored)
SCENE_SHAPES = ("ellipse", "rectangle", "triangle")


def scene_object_mask(
    shape: str, cx: float, cy: float, rx: float, ry: float, theta: float, size=SCENE_SIZE
) -> np.ndarray:
    """A filled shape (boolean H x W) centred at (cx, cy) with half-extents (rx, ry), rotated by theta."""
    v, u = np.mgrid[: size[0], : size[1]] + 0.5
    c, s = math.cos(theta), math.sin(theta)
    x, y = (c * (u - cx) + s * (v - cy)) / rx, (-s * (u - cx) + c * (v - cy)) / ry
    if shape == "ellipse":
        return x**2 + y**2 <= 1
    if shape == "rectangle":
        return (np.abs(x) <= 1) & (np.abs(y) <= 1)
    return (y <= 1) & (y >= 2 * np.abs(x) - 1)  # triangle, apex up


def render_segmentation_scene(rng: np.random.Generator, photos: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(image uint8 H x W x 3, mask uint8 H x W): mask 1 = background, 2..5 = the texture kinds, 0 = the
    2-px boundary between regions (ignored)."""
    from scipy import ndimage

    h, w = SCENE_SIZE
    photo = photos[int(rng.integers(len(photos)))]
    image = photo_patch(photo, rng, lo=0.3, hi=0.6, out=w)[:h].astype(np.float64)
    labels = np.zeros((h, w), np.uint8)  # train ids
    for _ in range(int(rng.integers(1, 5))):
        kind = int(rng.integers(len(SCENE_KINDS)))
        inside = scene_object_mask(
            SCENE_SHAPES[int(rng.integers(len(SCENE_SHAPES)))],
            rng.uniform(8, w - 8),
            rng.uniform(8, h - 8),
            rng.uniform(7, 18),
            rng.uniform(7, 16),
            rng.uniform(0, math.pi),
        )
        texture = {
            "colours": rng.uniform(0, 255, (2, 3)),
            "kind": TEXTURE_KINDS.index(SCENE_KINDS[kind]),
            "period": float(rng.uniform(7.0, 12.0)),
            "angle": float(rng.uniform(0, math.pi)),
        }
        image[inside] = render_texture(texture, rng, size=w)[:h][inside]
        labels[inside] = 1 + kind
    boundary = ndimage.grey_dilation(labels, size=3) != ndimage.grey_erosion(labels, size=3)
    mask = labels + 1
    mask[boundary] = 0
    return np.clip(image, 0, 255).astype(np.uint8), mask


def gen_scenes(root: Path, seed: int) -> None:
    rng = np.random.default_rng([seed, 10])
    photos = [load_photo("skimage", name) for name in PHOTOS]
    items = [render_segmentation_scene(rng, photos) for _ in range(N_SCENES_TRAIN + N_SCENES_VAL)]
    write_folder_dataset(
        root,
        "scenes",
        {"training": items[:N_SCENES_TRAIN], "validation": items[N_SCENES_TRAIN:]},
        _info(
            "scenes",
            seed,
            len(SCENE_CLASSES),
            "procedural textured objects on patches of the scikit-image photographs of `photos`",
            reduce_zero_label=True,
            class_names=list(SCENE_CLASSES),
            size=list(SCENE_SIZE),
        ),
    )


# --- image-text pairs: captions that state what the images show -------------------------------------
