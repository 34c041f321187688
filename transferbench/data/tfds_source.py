"""tfds datasets through `tfds.data_source`: random access over prepared ArrayRecord files, no TensorFlow
at run time. Split strings are resolved by transferbench (data.splits) on indices."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .folder import DataMissingError
from .splits import resolve_split

PREPARE = (
    "prepare it once with TensorFlow installed: pip install 'transferbench[tfds]' tensorflow && "
    "python -c \"import tensorflow_datasets as tfds; tfds.builder('{name}', data_dir='{dir}').download_and_prepare()\""
)


def data_dir(explicit=None) -> str:
    """--data-dir, else $TFDS_DATA_DIR, else ~/tensorflow_datasets (tfds's own order)."""
    return str(Path(explicit or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets").expanduser())


def _split_names(spec: str) -> list[str]:
    return list(dict.fromkeys(part.split("[")[0].strip() for part in spec.split("+")))


class TfdsDataset(torch.utils.data.Dataset):
    """Examples of `split` (a tfds split string, e.g. 'train[:800]+train[45000:45200]') as (image, label).

    label_fn maps the example dict (numpy values) to an int; default `example['label']`. `label_rule` names it
    (data.vtab.LABEL_RULES), which gives the split an identity (`identity()`: what caches of its decoded images
    are keyed on); a label_fn without a name leaves it without one.
    """

    def __init__(
        self,
        name: str,
        split: str,
        transform: Callable | None = None,
        *,
        label_fn: Callable[[dict], int] | None = None,
        image_key: str = "image",
        data_dir_=None,
        label_rule: str | None = None,
    ):
        import tensorflow_datasets as tfds

        self.name, self.split, self.transform = name, split, transform
        self.label_fn = label_fn or (lambda ex: int(ex["label"]))
        self.label_rule = label_rule or (None if label_fn else "label")
        self.image_key = image_key
        where = data_dir(data_dir_)
        self.sources = {}
        absl_log = logging.getLogger("absl")
        level = absl_log.level
        for s in _split_names(split):
            try:
                absl_log.setLevel(logging.ERROR)  # tfds warns per variant folder; the error below says it once
                self.sources[s] = tfds.data_source(name, split=s, data_dir=where, download=False)  # never at run time
            except Exception as e:  # noqa: BLE001 - tfds raises several types for "not prepared"
                why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                raise DataMissingError(
                    f"tfds dataset {name!r} split {s!r} cannot be read from {where} (searched --data-dir, "
                    f"TFDS_DATA_DIR, ~/tensorflow_datasets; tfds says: {why}); " + PREPARE.format(name=name, dir=where)
                ) from None
            finally:
                absl_log.setLevel(level)
        parts = resolve_split(split, {s: len(src) for s, src in self.sources.items()})
        self.index = [(s, int(i)) for s, idx in parts for i in idx]
        features = next(iter(self.sources.values())).dataset_info.features
        # the 'label' feature's classes; tasks with a label_fn (VTAB structured) state their own
        self.num_classes = int(getattr(features["label"], "num_classes", 0)) if "label" in features else 0
        # the ClassLabel's names, in label order (zero-shot prompts are built from them)
        self.class_names = list(getattr(features["label"], "names", None) or []) if "label" in features else []

    def __len__(self) -> int:
        return len(self.index)

    def identity(self) -> dict | None:
        """What determines this split's examples: the tfds name and version, the split string, the image feature
        and the label rule (None without a named rule)."""
        if self.label_rule is None:
            return None
        version = str(next(iter(self.sources.values())).dataset_info.version)
        return {
            "source": "tfds",
            "name": self.name,
            "version": version,
            "split": self.split,
            "image": self.image_key,
            "label": self.label_rule,
        }

    def example(self, i: int) -> dict:
        s, j = self.index[i]
        return self.sources[s][j]

    def __getitem__(self, i: int):
        ex = self.example(i)
        img = np.asarray(ex[self.image_key])
        if img.ndim == 3 and img.shape[-1] == 1:
            img = img[..., 0]
        if img.dtype != np.uint8:  # dSprites stores {0, 1}
            img = (img * 255).astype(np.uint8) if img.max() <= 1 else img.astype(np.uint8)
        pil = Image.fromarray(img).convert("RGB")  # grayscale tiled to 3 channels
        return (self.transform(pil) if self.transform else pil), int(self.label_fn(ex))
