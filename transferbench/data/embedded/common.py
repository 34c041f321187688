"""What the generators share: the sets, their versions and sizes, the split of a shuffled list into
train800 / val200 / test, the info every set records, and the shipped photographs some generators cut from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ...fingerprint import for_cache
from ...paths.home import cache

VERSIONS = {
    "digits": "1",
    "mnist": "1",
    "dsprites_loc": "1",
    "dsprites_ori": "1",
    "clevr_count": "1",
    "clevr_dist": "1",
    "photos": "1",
    "upstream": "6",
    "scenes": "3",
    "captions": "1",
}
# the module of each set's generator: its code (import closure) and the data packages are the set's fingerprint,
# kept in its info.json; a set made by other code is generated again (`ensure`)
GENERATOR_MODULE = {
    "digits": "digits",
    "mnist": "digits",
    "dsprites_loc": "sprites",
    "dsprites_ori": "sprites",
    "clevr_count": "clevr",
    "clevr_dist": "clevr",
    "photos": "photos",
    "upstream": "upstream",
    "scenes": "scenes",
    "captions": "captions",
}
DOWNSTREAM = ("digits", "mnist", "dsprites_loc", "dsprites_ori", "clevr_count", "clevr_dist", "photos")
SEGMENTATION = ("scenes",)
IMAGE_TEXT = ("captions",)
N_TRAIN, N_VAL, N_TEST = 800, 200, 1000
N_UPSTREAM, N_UPSTREAM_TEST = 16000, 1000
N_GLYPHS, N_TEXTURES = 32, 32  # upstream classes: glyphs, textures, photographs, positions, in order
PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "camera",
    "coins",
    "grass",
    "brick",
)


def embedded_root() -> Path:
    return cache("embedded")


def generator_code(name: str) -> str:
    """The fingerprint digest of the code and libraries that generate set `name`."""
    return for_cache("embedded", f"{__package__}.{GENERATOR_MODULE[name]}").digest


def version(name: str) -> str:
    return f"{name}-v{VERSIONS[name]}"


def _slices(items: list) -> dict:
    """train800, val200 and up to N_TEST test items, in the order given."""
    return {
        "train800": items[:N_TRAIN],
        "val200": items[N_TRAIN : N_TRAIN + N_VAL],
        "test": items[N_TRAIN + N_VAL : N_TRAIN + N_VAL + N_TEST],
    }


def _split(items: list, rng: np.random.Generator) -> dict:
    order = rng.permutation(len(items))
    return _slices([items[i] for i in order])


def _info(name: str, seed: int, num_classes: int, source: str, **extra) -> dict:
    return {
        "num_classes": num_classes,
        "source": source,
        "generator_version": VERSIONS[name],
        "code": generator_code(name),
        "seed": seed,
        "version": version(name),
        **extra,
    }


# --- real data shipped in packages -----------------------------------------------------------------


UPSTREAM_PHOTOS = (
    ("sklearn", "china.jpg"),
    ("sklearn", "flower.jpg"),
    ("matplotlib", "grace_hopper.jpg"),
    ("matplotlib", "Minduka_Present_Blue_Pack.png"),
    ("skimage", "colorwheel"),
    ("skimage", "retina"),
    ("skimage", "stereo_motorcycle"),
    ("skimage", "logo"),
    ("skimage", "clock"),
    ("skimage", "gravel"),
    ("skimage", "moon"),
    ("skimage", "page"),
    ("skimage", "text"),
    ("skimage", "cell"),
    ("matplotlib", "topobathy.npz"),
    ("skimage", "microaneurysms"),
)
N_PHOTOS = len(UPSTREAM_PHOTOS)
N_QUARTERS = 4  # each upstream photograph gives one class per column quarter
UPSTREAM_ROWS = 0.65  # the upstream set cuts its photograph classes from the top 65% of the rows; `scenes` the rest


def load_photo(package: str, name: str) -> np.ndarray:
    """One shipped photograph as uint8 RGB."""
    if package == "sklearn":
        from sklearn.datasets import load_sample_image

        im = load_sample_image(name)
    elif package == "matplotlib":
        import matplotlib.cbook

        if name.endswith(".npz"):  # an elevation map, shown as grey levels
            z = matplotlib.cbook.get_sample_data(name)["topo"].astype(np.float64)
            im = (z - z.min()) / (z.max() - z.min()) * 255
        else:
            with matplotlib.cbook.get_sample_data(name) as f:
                im = np.asarray(Image.open(f).convert("RGB"))
    else:
        import skimage.data

        im = getattr(skimage.data, name)()
        im = im[0] if isinstance(im, tuple) else im  # stereo pairs: the left view
    im = np.asarray(im)
    im = np.repeat(im[..., None], 3, axis=2) if im.ndim == 2 else im[..., :3]
    return im.astype(np.uint8)


def photo_patch(
    im: np.ndarray,
    rng: np.random.Generator,
    lo: float = 0.12,
    hi: float = 0.3,
    x_range=(0.0, 1.0),
    out: int = 32,
    y_range=(0.0, 1.0),
) -> np.ndarray:
    """A random square patch of lo..hi of the photograph's shorter side, inside the column range x_range and the
    row range y_range (fractions of the width and height), resized to out x out."""
    h, w = im.shape[:2]
    x0, x1 = int(w * x_range[0]), int(w * x_range[1])
    y0, y1 = int(h * y_range[0]), int(h * y_range[1])
    c = min(int(rng.uniform(lo, hi) * min(h, w)), x1 - x0, y1 - y0)
    x, y = rng.integers(x0, x1 - c + 1), rng.integers(y0, y1 - c + 1)
    return np.asarray(Image.fromarray(im[y : y + c, x : x + c]).resize((out, out), Image.BILINEAR))
