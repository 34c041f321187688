"""The fine-tuning protocols' settings: App. E's recipe (`FinetuneSettings`), which VTAB-1k runs as it is and the
high-resolution fine-tuning (App. D), the gradient diagnostics and the robustness classifier run with their own
changes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import BF16, BF16_HELP, BF16_SOURCE, EVAL_BATCH, EXECUTION, PIXELS_HELP, Settings, setting
from .choices import ATTN_STD_TOKENS, AUGMENTATIONS, IMAGE_SAMPLES, LOSSES, POSEMB_METHODS

APP_E = "DPN App. E (its big_vision config)"


class FinetuneSettings(Settings):
    """The VTAB-1k fine-tuning recipe (DPN App. E), which the robustness classifier, high-res fine-tuning and the
    gradient diagnostics run too (each protocol's own settings override the defaults it changes)."""

    pixels: str = setting("auto", "big_vision value_range(-1, 1)", PIXELS_HELP)
    loss: Literal[tuple(LOSSES)] = setting(  # type: ignore[valid-type]
        "sigmoid", f"{APP_E}: sigmoid_xent", "sigmoid: big_vision's sigmoid_xent | softmax: softmax cross-entropy"
    )
    optimizer: Literal["sgd"] = setting("sgd", APP_E, "SGD with momentum (the only optimiser of the recipe)")
    lr: float = setting(0.0003, f"{APP_E} prints 0.0003", "learning rate (peak, after warm-up)", gt=0)
    momentum: float = setting(0.9, APP_E, "SGD momentum", ge=0)
    weight_decay: float = setting(0.0, APP_E, "weight decay (torch SGD's)", ge=0)
    clip: float = setting(1.0, APP_E, "gradient clipping by global norm (0: none)", ge=0)
    batch: int = setting(512, APP_E, "images per step", ge=1)
    steps: int = setting(2500, APP_E, "training steps", ge=1)
    warmup_steps: int = setting(200, APP_E, "linear warm-up steps, then cosine to 0", ge=0)
    resolution: int = setting(224, APP_E, "training and evaluation resolution (position embeddings resampled)", ge=1)
    bf16: BF16 = setting("auto", BF16_SOURCE, BF16_HELP)


class VtabSettings(FinetuneSettings):
    """DPN §6.1 + App. E: every setting of the recipe at the paper's value, and which runs are reported."""

    final: Literal["none", "retrain"] = setting(
        "none",
        'DPN §6.1 ("the corresponding mean test score")',
        "none: report the test accuracy of the val200-selected train800 runs | retrain: retrain on train800 + "
        "val200 at the selected lr (VPT, task_adaptation)",
    )


APP_D = "DPN App. D (its big_vision config)"


class HiresSettings(FinetuneSettings):
    """DPN App. D: App. E's recipe at a higher resolution, with its own lr, length and augmentation."""

    lr: float = setting(0.03, APP_D, "learning rate (peak, after warm-up)", gt=0)
    steps: int = setting(5000, APP_D, "training steps", ge=1)
    warmup_steps: int = setting(500, APP_D, "linear warm-up steps, then cosine to 0", ge=0)
    resolution: int = setting(384, APP_D, "the high resolution", ge=1)
    base_resolution: int | Literal["checkpoint"] = setting(
        "checkpoint", APP_D, "the base stage's resolution: the checkpoint's own (224) or a number of pixels"
    )
    eval_resize_small: int = setting(
        418, f"{APP_D}: resize_small(418)|central_crop(384)", "resize-small before the centre crop (scaled at base)"
    )
    augment: Literal[(*AUGMENTATIONS, "dataset")] = setting(  # type: ignore[valid-type]
        "inception_flip", f"{APP_D}: inception_crop(384)|flip_lr", "training augmentation; dataset: each entry's own"
    )
    head: Literal["new", "auto"] = setting(
        "new", f"{APP_D}: dont_load head", "new: a zero-initialised head | auto: keep a head with the classes"
    )
    posemb: Literal[(*POSEMB_METHODS, "set_input_size")] = setting(  # type: ignore[valid-type]
        "big_vision",
        "big_vision resample_posemb",
        "position-embedding resampling: big_vision | scenic | timm (set_input_size: a py: model's own)",
    )


DIAG = "docs/diagnostics.md"


class DiagnoseSettings(FinetuneSettings):
    """The forward measures' images (the over-smoothing measures) and the fine-tuning whose gradients are read
    (App. E's recipe, short)."""

    images: int = setting(10000, DIAG, "images the forward measures average over", ge=1)
    image_split: Literal["train", "test"] = setting("train", DIAG, "the split the images come from")
    image_sample: Literal[IMAGE_SAMPLES] = setting(  # type: ignore[valid-type]
        "random", DIAG, "random: N images seeded by the cell's seed | first: the first N"
    )
    attn_std_tokens: Literal[ATTN_STD_TOKENS] = setting(  # type: ignore[valid-type]
        "patches", DIAG, "attention row std over the patch queries and keys | all (cls included)"
    )
    eval_batch: int = setting(64, EXECUTION, "images per forward batch", ge=1)
    lr: float = setting(0.01, DIAG, "learning rate of the fine-tuning whose gradients are read", gt=0)
    steps: int = setting(100, DIAG, "fine-tuning steps", ge=1)
    warmup_steps: int = setting(10, DIAG, "linear warm-up steps, then cosine to 0", ge=0)
    grad_last: int = setting(50, DIAG, "per-layer gradient norms: mean over the last k steps", ge=1)


CLASSIFIER = "App. E's fine-tuning recipe for the classifier under test (docs/robustness.md)"


class CorruptionSettings(FinetuneSettings):
    """The classifier under test (a checkpoint head with the dataset's classes, else App. E's recipe fine-tuned on
    the clean training split) and how its corrupted test images are made (hendrycks/robustness)."""

    classifier: Literal["auto", "finetune", "checkpoint"] = setting(
        "auto",
        CLASSIFIER,
        "auto: the checkpoint's head where it has the classes, else fine-tune | finetune | checkpoint",
    )
    lr: float = setting(0.01, CLASSIFIER, "learning rate of the classifier's fine-tuning", gt=0)
    eval_batch: int = setting(EVAL_BATCH, EXECUTION, "images per evaluation batch", ge=1)
    render: int | None = setting(
        None,
        "hendrycks/robustness: ImageNet-C made at 224",
        "generated corruptions: the side the 15 functions run at (null: the resolution)",
    )
    corruptions: str | list[str] = setting(
        "all", "Hendrycks & Dietterich: 15 corruptions x 5 severities", "all, or a list of names: a cell per corruption"
    )
    corruption: str | None = Field(None, json_schema_extra={"source": "", "keyed": False, "hidden": True})
