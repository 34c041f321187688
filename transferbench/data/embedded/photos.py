"""`photos`: which of 10 scikit-image photographs a patch comes from (test patches from a held-out strip)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..folder import write_folder_dataset
from .common import N_TEST, N_TRAIN, N_VAL, PHOTOS, _info, load_photo, photo_patch


def gen_photos(root: Path, seed: int) -> None:
    rng = np.random.default_rng([seed, 3])
    photos = [load_photo("skimage", name) for name in PHOTOS]

    def patch(k: int, test: bool):  # test patches: a held-out strip of each photograph
        return photo_patch(photos[k], rng, x_range=(0.75, 1.0) if test else (0.0, 0.75), out=64)

    train = [(patch(k, False), k) for k in rng.integers(0, len(PHOTOS), N_TRAIN + N_VAL)]
    test = [(patch(k, True), k) for k in rng.integers(0, len(PHOTOS), N_TEST)]
    write_folder_dataset(
        root,
        "photos",
        {"train800": train[:N_TRAIN], "val200": train[N_TRAIN:], "test": test},
        _info("photos", seed, len(PHOTOS), "scikit-image photographs: " + ", ".join(PHOTOS)),
    )


# --- dSprites-style sprites ----------------------------------------------------------------------
