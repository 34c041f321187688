"""Corruption robustness's data: the corrupted data's entry, the corruption list, and the settings a fine-tuned
classifier is identified by (its settings model is transferbench.settings.finetune.CorruptionSettings)."""

from __future__ import annotations

from typing import Literal

from ...data.corruptions import check_name
from ...data.imagenet_c import CORRUPTIONS
from ...data.sources import DatasetEntry
from ...settings.choices import AUGMENTATIONS
from ...settings.finetune import FinetuneSettings
from ..base import validated_entry

# what the classifier's fine-tuning reads: every setting of App. E's recipe (the loss and the pixels among them), so
# that a classifier trained under other settings is never reused
TRAIN_KEYS = tuple(n for n in FinetuneSettings.model_fields if n != "backbone_preprocess")


class CorruptionDataset(DatasetEntry):
    """A clean dataset (tfds or embedded: `test`, and `train` for fine-tuning a head) and where its corrupted
    copies come from."""

    train: str | None = None  # type: ignore[assignment]  # clean training split; None: the checkpoint's head only
    classes: int
    augment: Literal[AUGMENTATIONS] = "crop_flip"  # type: ignore[valid-type]
    crop_pct: float = 0.875  # the test images' geometry: short side resolution / crop_pct, centre crop (256 -> 224)
    corrupted: Literal["generate", "folder", "tfds", "npy"] = "generate"
    path: str | None = None  # folder / npy: under --data-dir (or absolute)
    tfds_corrupted: str = "imagenet2012_corrupted/{corruption}_{severity}"  # corrupted: tfds; a name:version pattern
    tfds_corrupted_split: str = "validation"
    baseline: Literal["alexnet", "reference"] = "reference"  # CE normalised by AlexNet's errors or the --reference's
    limit: int | None = None  # the first N test images only (the embedded suite)


def entry(cell) -> dict:
    """A corruption cell's dataset entry (`Adapter.entry` for the adapter's modules below it)."""
    return validated_entry(CorruptionDataset, cell.dataset, cell.dataset_config)


def corruption_list(value) -> list[str]:
    """The spec's / --set's `corruptions`: 'all' or a list (or comma-separated string) of names."""
    if value in (None, "all"):
        return list(CORRUPTIONS)
    names = value.strip("[]").split(",") if isinstance(value, str) else list(value)
    return [check_name(str(n).strip()) for n in names]
