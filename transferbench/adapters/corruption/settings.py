"""Corruption robustness's settings: the classifier under test, the corrupted data's entry, the corruption list."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...data.corruptions import check_name
from ...data.imagenet_c import CORRUPTIONS
from ...data.sources import DatasetEntry
from ...data.transforms import AUGMENTATIONS
from ..classify import FinetuneSettings
from ..settings import EXECUTION, setting

CLASSIFIER = "App. E's fine-tuning recipe for the classifier under test (docs/robustness.md)"


class CorruptionSettings(FinetuneSettings):
    """The classifier under test (a checkpoint head with the dataset's classes, else App. E's recipe fine-tuned on
    the clean training split) and how its corrupted test images are made (hendrycks/robustness)."""

    classifier: Literal["auto", "finetune", "checkpoint"] = setting(
        "auto",
        CLASSIFIER,
        "auto: the checkpoint's head where it has the classes, else fine-tune | finetune | checkpoint",
    )
    loss: Literal["sigmoid", "softmax"] = setting(
        "softmax",
        "the classifier's loss as every record of this task ran it; App. E's sigmoid_xent is --set loss=sigmoid",
        "sigmoid: big_vision's sigmoid_xent | softmax: softmax cross-entropy",
        keyed=False,
    )
    lr: float = setting(0.01, CLASSIFIER, "learning rate of the classifier's fine-tuning", gt=0)
    eval_batch: int = setting(256, EXECUTION, "images per evaluation batch", ge=1)
    render: int | None = setting(
        None,
        "hendrycks/robustness: ImageNet-C made at 224",
        "generated corruptions: the side the 15 functions run at (null: the resolution)",
    )
    corruptions: str | list[str] = setting(
        "all", "Hendrycks & Dietterich: 15 corruptions x 5 severities", "all, or a list of names: a cell per corruption"
    )
    corruption: str | None = Field(None, json_schema_extra={"source": "", "keyed": False, "hidden": True})


TRAIN_KEYS = (
    "optimizer",
    "lr",
    "momentum",
    "weight_decay",
    "clip",
    "batch",
    "steps",
    "warmup_steps",
    "resolution",
    "bf16",
)


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
    return CorruptionDataset.model_validate({**cell.dataset_config, "name": cell.dataset}).model_dump()


def corruption_list(value) -> list[str]:
    """The spec's / --set's `corruptions`: 'all' or a list (or comma-separated string) of names."""
    if value in (None, "all"):
        return list(CORRUPTIONS)
    names = value.strip("[]").split(",") if isinstance(value, str) else list(value)
    return [check_name(str(n).strip()) for n in names]
