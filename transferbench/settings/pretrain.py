"""Pretraining's settings (DPN App. C: AugReg's ImageNet-1k recipe)."""

from __future__ import annotations

from typing import Literal

from .base import BF16, BF16_HELP, BF16_SOURCE, Settings, setting
from .choices import AUGMENTATIONS, LOSSES, RANDAUG

APP_C = "DPN App. C (big_vision configs/vit_i1k.py, AugReg)"


class PretrainSettings(Settings):
    """DPN App. C: AugReg's ImageNet-1k recipe (big_vision configs/vit_i1k.py)."""

    pixels: str = setting(
        "auto",
        "big_vision value_range(-1, 1)",
        "auto: [-1, 1] for random init (the checkpoint records it) | inception | imagenet | mean=R,G,B/std=R,G,B",
    )
    lr: float = setting(0.001, APP_C, "Adam learning rate (peak)", gt=0)
    wd: float = setting(
        0.0001,
        f"{APP_C}; big_vision optax.py",
        "weight decay in big_vision's semantics: sched(t) x wd x kernel, not x lr (AdamW gets wd / lr)",
        ge=0,
    )
    beta1: float = setting(
        0.9, f"{APP_C}: scale_by_adam (optax's default b1)", "Adam's first-moment decay", keyed=False, gt=0, lt=1
    )
    beta2: float = setting(0.999, APP_C, "Adam's second-moment decay", gt=0, lt=1)
    warmup_steps: int = setting(10000, APP_C, "linear warm-up steps, then cosine to 0", ge=0)
    steps: int = setting(93000, "DPN §5 / App. C: 300 epochs of train[:99%]", "training steps", ge=1)
    batch: int = setting(4096, APP_C, "images per step", ge=1)
    clip: float = setting(1.0, APP_C, "gradient clipping by global norm (0: none)", ge=0)
    loss: Literal[tuple(LOSSES)] = setting(  # type: ignore[valid-type]
        "sigmoid", f"{APP_C}: sigmoid_xent", "sigmoid: big_vision's sigmoid_xent | softmax: softmax_xent"
    )
    init_head_bias: float = setting(-6.9, f"{APP_C}: init_head_bias", "the head's initial bias (sigmoid at 1/1000)")
    aug: Literal[("auto", *RANDAUG)] = setting(  # type: ignore[valid-type]
        "auto", f"{APP_C}'s table", "RandAugment + mixup strength; auto: the table's per model size"
    )
    rep_size: Literal["auto", "on", "off"] | bool = setting(
        "auto", APP_C, "the representation layer (dense + tanh) before the head; auto: every size but S/32"
    )
    dropout_b_l: float = setting(0.1, APP_C, "dropout and stochastic depth, for B and L only", ge=0, lt=1)
    resolution: int = setting(224, APP_C, "training and evaluation resolution", ge=1)
    augment: Literal[AUGMENTATIONS] = setting(  # type: ignore[valid-type]
        "inception_flip", f"{APP_C}: inception_crop(224)|flip_lr", "crop and flip before RandAugment"
    )
    eval_resize_small: int | None = setting(
        256, f"{APP_C}: resize_small(256)|central_crop(224)", "resize-small before the centre crop (null: none)"
    )
    dtn_lr_mult: float = setting(
        1.0,
        "DTN (Shao et al.) trains its norms' parameters at the network's learning rate",
        "learning-rate multiplier of DTN's mixing logits and positional weights (mix_mean, mix_var, pos_weight)",
        keyed=False,
        gt=0,
    )
    bf16: BF16 = setting("auto", BF16_SOURCE, BF16_HELP)
