"""Semantic segmentation's settings (DPN App. G: Segmenter's linear decoder, mmsegmentation's ADE20K pipeline)."""

from __future__ import annotations

from typing import Literal

from .base import BF16, BF16_HELP, BF16_SOURCE, PIXELS_HELP, Settings, setting
from .choices import DECODER_TOKENS, POSEMB_METHODS, SCHEDULES

APP_G = "DPN App. G (its scenic config)"

MMSEG = "mmsegmentation's ADE20K pipeline"


class SegSettings(Settings):
    """DPN App. G: Segmenter's linear decoder on the fine-tuned backbone (scenic), mmsegmentation's ADE20K data
    pipeline and sliding-window evaluation."""

    pixels: str = setting(
        "imagenet", f"{APP_G}: pp_train / pp_eval standardise with ImageNet's mean and std", PIXELS_HELP
    )
    optimizer: Literal["adamw"] = setting("adamw", APP_G, "AdamW (optax.adamw: lr_t x wd x param)")
    lr: float = setting(3.0e-5, APP_G, "learning rate (peak)", gt=0)
    weight_decay: float = setting(0.01, APP_G, "weight decay, torch AdamW's semantics", ge=0)
    beta1: float = setting(
        0.9, f"{APP_G}: optax.adamw's default b1", "Adam's first-moment decay", keyed=False, gt=0, lt=1
    )
    beta2: float = setting(
        0.999, f"{APP_G}: optax.adamw's default b2", "Adam's second-moment decay", keyed=False, gt=0, lt=1
    )
    skip_scale_and_bias: bool = setting(
        True, "scenic skip_scale_and_bias_regularization", "no decay on 1-D parameters (norm scales, biases)"
    )
    drop_path: float = setting(0.1, APP_G, "stochastic depth, growing linearly to this in the last block", ge=0, lt=1)
    schedule: Literal[SCHEDULES] = setting("poly", APP_G, "poly: (1 - t/T)^power to 0 | cosine")  # type: ignore[valid-type]
    power: float = setting(0.9, APP_G, "the polynomial schedule's power", gt=0)
    warmup_steps: int = setting(0, APP_G, "linear warm-up steps", ge=0)
    clip: float = setting(0.0, APP_G, "gradient clipping by global norm (0: none)", ge=0)
    batch: int = setting(16, APP_G, "images per step", ge=1)
    epochs: int = setting(128, APP_G, "training epochs (see epoch)", ge=1)
    epoch: Literal["pool", "fraction"] = setting(
        "pool",
        f"{APP_G}: steps_per_epoch = 20210 // batch_size",
        "pool: an epoch is (all training images // batch) steps whatever the fraction | fraction: its own images",
    )
    steps: int | None = setting(
        None,
        f"not in {APP_G}, which counts epochs: a step count for short runs",
        "an explicit step count (null: epochs)",
    )
    decoder_tokens: Literal[DECODER_TOKENS] = setting(  # type: ignore[valid-type]
        "prenorm", f"{APP_G}: out_with_norm = False", "prenorm: the last block's tokens before the final norm | norm"
    )
    posemb: Literal[(*POSEMB_METHODS, "set_input_size")] = setting(  # type: ignore[valid-type]
        "scenic",
        f"{APP_G}: pos_interpolation_method = 'bilinear'",
        "position-embedding resampling: scenic (jax.image."
        "resize, half-pixel) | big_vision | timm (set_input_size: a py: model's own)",
    )
    crop: int = setting(512, MMSEG, "training crop = the backbone's input size", ge=1)
    ratio_min: float = setting(0.5, MMSEG, "random resize of the short side to crop x U(ratio_min, ratio_max)", gt=0)
    ratio_max: float = setting(2.0, MMSEG, "see ratio_min", gt=0)
    cat_max_ratio: float = setting(
        0.75, f"{MMSEG}: RandomCrop", "redraw a crop (up to 10 times) where one class covers at least this", gt=0
    )
    photometric: bool = setting(True, f"{MMSEG}: PhotoMetricDistortion", "photometric distortion of training crops")
    test_short: int = setting(512, f"{MMSEG}: Resize (2048, 512), keep ratio", "test image short side", ge=1)
    window: int = setting(512, MMSEG, "sliding-window side; logits averaged where windows overlap", ge=1)
    stride: int = setting(341, MMSEG, "sliding-window stride", ge=1)
    fraction: float = setting(1.0, f"{APP_G}: train_data_pct (swept)", "the share of training images", gt=0, le=1)
    bf16: BF16 = setting("auto", BF16_SOURCE, BF16_HELP)
