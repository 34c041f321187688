"""`scenes`: a miniature of ADE20K's scene parsing, in its mask convention: stuff regions and things, each a kind
whose identity the upstream set teaches, over a photograph background, occluding one another."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..folder import write_folder_dataset
from .common import N_GLYPHS, N_QUARTERS, PHOTOS, UPSTREAM_PHOTOS, UPSTREAM_ROWS, _info, load_photo, photo_patch
from .upstream import TEXTURE_KINDS, glyph_ink, glyph_strokes, render_texture

SCENE_SIZE = (48, 72)  # (height, width): not square, so the test-time resize and sliding windows matter
N_SCENES_TRAIN, N_SCENES_VAL = 512, 128
N_STUFF, N_THINGS = 8, 4
STUFF_PHOTOS = UPSTREAM_PHOTOS[:N_STUFF]  # stuff class k: the second column quarter of upstream photograph k ...
STUFF_COLUMNS = (1 / N_QUARTERS, 2 / N_QUARTERS)  # (its lower rows hold the subject; the outer ones are mostly plain)
STUFF_ROWS = (UPSTREAM_ROWS, 1.0)  # ... below the rows the upstream set cuts its patches from
SCENE_CLASSES = (
    "background",
    *(name.split(".")[0].lower() for _, name in STUFF_PHOTOS),
    *(f"glyph_{g}" for g in range(N_THINGS)),  # things: signs bearing upstream glyph class g
)  # train ids 0..12; stored +1, 0 = boundary (ignored)
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


def colour_jitter(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A region's colours moved as a whole: a gain per channel (0.8..1.2), a brightness (0.8..1.2) and an offset
    (+-20), so a class's pixels vary in colour from scene to scene while the photograph keeps its own structure."""
    return image * rng.uniform(0.8, 1.2, 3) * rng.uniform(0.8, 1.2) + rng.uniform(-20, 20)


def render_sign(segs: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """A thing: a square plate (size x size) of a random dark two-colour pattern bearing a glyph in light strokes,
    as the upstream glyphs are drawn, under the upstream glyphs' jitter of rotation, scale, shift and width."""
    plate = {
        "colours": rng.uniform(0, 110, (2, 3)),
        "kind": int(rng.integers(len(TEXTURE_KINDS))),
        "period": float(rng.uniform(5.0, 12.0)),
        "angle": float(rng.uniform(0, math.pi)),
    }
    ground = render_texture(plate, rng, size=size).astype(np.float64)
    ink = glyph_ink(segs, rng, size)[..., None]
    return ground * (1 - ink) + rng.uniform(170, 255, 3) * ink


def render_segmentation_scene(
    rng: np.random.Generator, photos: list[np.ndarray], stuff: list[np.ndarray], glyphs: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """(image uint8 H x W x 3, mask uint8 H x W): a patch of a `photos` photograph as background (mask 1), then
    1-3 stuff regions (ellipses, rectangles, triangles of 20-60 px, each cut from its class's source and
    colour-jittered: mask 2..9) and 1-2 signs (30-42 px squares, partly outside the frame at times: mask 10..13)
    in random order, each occluding what came before; 0 = the 2-px boundary between regions (ignored)."""
    from scipy import ndimage

    h, w = SCENE_SIZE
    photo = photos[int(rng.integers(len(photos)))]
    image = photo_patch(photo, rng, lo=0.3, hi=0.6, out=w)[:h].astype(np.float64)
    labels = np.zeros((h, w), np.uint8)  # train ids
    objects = ["stuff"] * int(rng.integers(1, 4)) + ["thing"] * int(rng.integers(1, 3))
    for i in rng.permutation(len(objects)):
        if objects[i] == "stuff":
            k = int(rng.integers(N_STUFF))
            inside = scene_object_mask(
                SCENE_SHAPES[int(rng.integers(len(SCENE_SHAPES)))],
                rng.uniform(0, w),
                rng.uniform(0, h),
                rng.uniform(12, 30),
                rng.uniform(10, 22),
                rng.uniform(0, math.pi),
            )
            fill = photo_patch(stuff[k], rng, lo=0.3, hi=0.6, x_range=STUFF_COLUMNS, y_range=STUFF_ROWS, out=w)
            image[inside] = colour_jitter(fill[:h].astype(np.float64), rng)[inside]
            labels[inside] = 1 + k
        else:
            g, size = int(rng.integers(N_THINGS)), int(rng.integers(30, 43))
            sign = render_sign(glyphs[g], rng, size)
            x, y = int(rng.integers(-size // 4, w - 3 * size // 4)), int(rng.integers(-size // 4, h - 3 * size // 4))
            ys, xs = slice(max(y, 0), min(y + size, h)), slice(max(x, 0), min(x + size, w))
            image[ys, xs] = sign[ys.start - y : ys.stop - y, xs.start - x : xs.stop - x]
            labels[ys, xs] = 1 + N_STUFF + g
    boundary = ndimage.grey_dilation(labels, size=3) != ndimage.grey_erosion(labels, size=3)
    mask = labels + 1
    mask[boundary] = 0
    return np.clip(image, 0, 255).astype(np.uint8), mask


def gen_scenes(root: Path, seed: int) -> None:
    """The upstream set teaches what each class is: stuff class k is the second column quarter of upstream
    photograph k (an upstream class of its own), cut here from the rows below those the upstream set uses, so no
    scene pixel is an upstream pixel; thing class g is a sign bearing upstream glyph class g, drawn anew. Colour
    jitter, the signs' random plates and occlusion keep low-level statistics from telling the classes apart. A
    random ViT separates the previous version's three texture classes at once (its mIoU was flat from a sixteenth
    of the images to all of them); telling these classes apart asks what the upstream set teaches."""
    rng = np.random.default_rng([seed, 10])
    photos = [load_photo("skimage", name) for name in PHOTOS]
    stuff = [load_photo(*p) for p in STUFF_PHOTOS]
    glyphs = glyph_strokes(N_GLYPHS, seed)[:N_THINGS]
    items = [render_segmentation_scene(rng, photos, stuff, glyphs) for _ in range(N_SCENES_TRAIN + N_SCENES_VAL)]
    write_folder_dataset(
        root,
        "scenes",
        {"training": items[:N_SCENES_TRAIN], "validation": items[N_SCENES_TRAIN:]},
        _info(
            "scenes",
            seed,
            len(SCENE_CLASSES),
            "patches of the scikit-image photographs of `photos` as background; stuff regions cut from the "
            "second column quarters of the first 8 upstream photographs, below the rows the upstream set uses, "
            "colour-jittered; signs bearing the first 4 upstream glyph classes on random dark patterned plates",
            reduce_zero_label=True,
            class_names=list(SCENE_CLASSES),
            size=list(SCENE_SIZE),
        ),
    )


# --- image-text pairs: captions that state what the images show -------------------------------------
