"""The few-shot linear probe's settings (big_vision's `fewshot_lsr`)."""

from __future__ import annotations

from typing import Literal

from .base import BF16, BF16_HELP, BF16_SOURCE, PIXELS_HELP, Settings, setting

DEFAULT_L2 = 2.0**10

COMMON = "big_vision configs/common_fewshot.py"


class FewshotSettings(Settings):
    """big_vision's few-shot linear probe (`fewshot_lsr`), as configs/common_fewshot.py sets it up."""

    resolution: int = setting(224, f"{COMMON}: central_crop(224)", "the crop the backbone sees", ge=1)
    resize: int | None = setting(256, f"{COMMON}: resize(256)", "resize before the central crop (null: none)")
    resize_mode: Literal["square", "short_side"] = setting(
        "square",
        "big_vision pp_ops resize(256): 256 x 256, aspect not kept",
        "square | short_side: resize the short side, aspect kept (timm, torchvision)",
    )
    pixels: str = setting("auto", "big_vision value_range(-1, 1)", PIXELS_HELP)
    l2: float = setting(DEFAULT_L2, f"{COMMON}: l2_reg 2**10", "ridge regularisation", ge=0)
    l2_sweep: list[float] = setting(
        [],
        f"not in {COMMON}, which fixes l2_reg: candidates chosen by leave-one-out",
        "l2 candidates chosen per cell by leave-one-out on the shots",
    )
    pool: Literal["model", "tok", "gap"] = setting(
        "model", "big_vision: the model's pre_logits", "model: as the backbone pools | tok | gap: for every backbone"
    )
    shots: int = setting(25, f"{COMMON}: shots 1, 5, 10, 25 (swept)", "training examples per class", ge=1)
    bf16: BF16 = setting("auto", BF16_SOURCE, BF16_HELP)
