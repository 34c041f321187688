"""Pixel normalisation: how uint8 pixels become the model's input, a property of the weights.

    inception  x / 127.5 - 1, pixels in [-1, 1]: big_vision's `value_range(-1, 1)` (mean = std = 0.5). Every
               big_vision `.npz` and every checkpoint this package trains.
    imagenet   (x / 255 - mean) / std with torchvision's ImageNet statistics mean (0.485, 0.456, 0.406),
               std (0.229, 0.224, 0.225): DeiT and most timm checkpoints (their `pretrained_cfg`).
    mean=R,G,B/std=R,G,B  explicit statistics on the [0, 1] scale.

Tasks take it as the hyper-parameter `pixels`: `auto` (the default) uses what the weights state (our
checkpoints record it in their header; big_vision `.npz` files are `inception`), `DEFAULT_PIXELS` where they
state nothing; any other value is used as given (`--set pixels=imagenet` for a timm file). The resolved value is
in every cell's hyper-parameters, hence in its key, its record and the report header.
"""

from __future__ import annotations

import functools

import torch

from ..cell import DEFAULT_PIXELS
from ..errors import UserError

PRESETS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
HELP = "inception ([-1, 1]), imagenet, or mean=R,G,B/std=R,G,B (on the [0, 1] scale)"


def stats(value: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) on the [0, 1] scale of a preset or an explicit `mean=R,G,B/std=R,G,B`; one UserError
    naming the accepted forms otherwise."""
    value = str(value).strip()
    if value in PRESETS:
        return PRESETS[value]
    try:
        parts = dict(part.split("=", 1) for part in value.split("/"))
        mean = tuple(float(v) for v in parts.pop("mean").split(","))
        std = tuple(float(v) for v in parts.pop("std").split(","))
        if parts or len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError
    except (ValueError, KeyError):
        raise UserError(f"pixels={value!r}: give {HELP}, or auto (what the weights state)") from None
    return mean, std


def normalise_uint8(x: torch.Tensor, pixels: str = DEFAULT_PIXELS) -> torch.Tensor:
    """uint8 images (..., 3, H, W) -> float32 (x / 255 - mean) / std, bit for bit as torchvision's ToDtype(scale=True)
    + Normalize compute it (a multiplication by 1/255, which rounds otherwise than a division by 255), on the
    images' device. The constants are made once per (pixels, device): building a tensor on a GPU from host values
    waits for the device's stream, once a batch otherwise."""
    mean, std = _constants(pixels, str(x.device))
    return x.float().mul_(1.0 / 255.0).sub_(mean).div_(std)


@functools.cache
def _constants(pixels: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = (torch.tensor(v, device=device).view(3, 1, 1) for v in stats(pixels))
    return mean, std


def check(value: str) -> None:
    """That a task's `pixels` setting is auto or a normalisation `stats` understands."""
    if value != "auto":
        stats(value)


__all__ = ["DEFAULT_PIXELS", "HELP", "PRESETS", "check", "normalise_uint8", "stats"]
