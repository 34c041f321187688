"""Image transforms (torchvision v2), the same at pretraining and transfer. Pixels end in [-1, 1],
big_vision's convention, which its checkpoints expect.

- eval: resize to (res, res) — or resize-small then centre crop (few-shot: 256 -> 224; high-res 418 -> 384);
- train: 'crop' resizes to res * 8/7 then takes a random res x res crop, 'flip' flips left-right, both
  as the scenic VTAB config's per-task options; 'inception' is the inception crop of high-res fine-tune.
"""
from __future__ import annotations

import torch
from torchvision.transforms import v2

AUGMENTATIONS = ("none", "crop", "flip", "crop_flip", "inception_flip")


def _to_signed() -> list:
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.5] * 3)]


def eval_transform(resolution: int, resize_small: int | None = None, resize_square: int | None = None):
    """`resize_small`: short side to that size, then a central crop; `resize_square`: both sides to that size,
    then a central crop (big_vision's `resize(256)|central_crop(224)`, LiT's zero-shot images)."""
    if resize_square:
        size = [v2.Resize((resize_square, resize_square)), v2.CenterCrop(resolution)]
    elif resize_small:
        size = [v2.Resize(resize_small), v2.CenterCrop(resolution)]
    else:
        size = [v2.Resize((resolution, resolution))]
    return v2.Compose([v2.ToImage(), *size, *_to_signed()[1:]])


def train_transform(resolution: int, augment: str = "crop_flip"):
    if augment not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {augment!r}; choose one of {AUGMENTATIONS}")
    ops: list = [v2.ToImage()]
    if augment.startswith("inception"):
        ops.append(v2.RandomResizedCrop(resolution, scale=(0.05, 1.0)))
    elif "crop" in augment:
        ops += [v2.Resize((resolution * 8 // 7, resolution * 8 // 7)), v2.RandomCrop(resolution)]
    else:
        ops.append(v2.Resize((resolution, resolution)))
    if "flip" in augment:
        ops.append(v2.RandomHorizontalFlip())
    return v2.Compose(ops + _to_signed()[1:])
