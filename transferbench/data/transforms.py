"""Image transforms (torchvision v2), the same at pretraining and transfer. Pixels end normalised as the weights
expect (`pixels`, data.pixels: 'inception' = [-1, 1], big_vision's convention and the default; 'imagenet'; explicit
statistics).

- eval: resize to (res, res) — or resize-small then centre crop (high-res 418 -> 384), or a square resize then
  centre crop (big_vision's `resize(256)|central_crop(224)`: few-shot, LiT zero-shot);
- train: 'crop' resizes to res * 8/7 then takes a random res x res crop, 'flip' flips left-right, both
  as the scenic VTAB config's per-task options; 'inception' is the inception crop of high-res fine-tune.

In-memory sets (every embedded set, export folders of equal-size images) are transformed a batch at a time
(`ImageTransform.batch`) from the same per-example draws as the per-example path: the resize runs once per
set, crops are a gather, flips a select, and the scaling one tensor operation.
"""

from __future__ import annotations

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from ..settings.choices import AUGMENTATIONS
from .pixels import DEFAULT_PIXELS, normalise_uint8, stats


def normalise(pixels: str = DEFAULT_PIXELS) -> list:
    """uint8 image tensors -> float32 normalised as `pixels` says (data.pixels)."""
    mean, std = stats(pixels)
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]


class ImageTransform:
    """A torchvision v2 pipeline, applied per example (`transform(image)`), or to a whole batch of equal-size
    uint8 images at once (`transform.batch(...)`, in-memory sets): the same operations in the same order,
    with the same per-example random draws, so both paths give the same tensors (tested)."""

    def __init__(self, prefix: list, crop=None, flip=None, pixels: str = DEFAULT_PIXELS, post=None):
        # prefix: deterministic ops up to the random ones; then the random crop and flip; then `post` (RandAugment,
        # per example only); then the pixel scaling
        self.prefix, self.crop, self.flip, self.suffix = prefix, crop, flip, normalise(pixels)
        self.pixels, self.post = pixels, post
        self.batchable = post is None  # engine.batches.batched: RandAugment has no batched form here
        self.pipeline = v2.Compose(prefix + [op for op in (crop, flip, post) if op is not None] + self.suffix)
        self._shape_probe = None

    def __call__(self, image):
        return self.pipeline(image)

    @property
    def random(self) -> bool:
        return self.crop is not None or self.flip is not None

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """The deterministic head of the pipeline on uint8 (N, C, H, W) images: done once per set, since the
        same images are revisited every epoch."""
        return v2.Compose(self.prefix)(images).as_subclass(torch.Tensor)

    def draws(self, seed: int | None, height: int, width: int) -> tuple[tuple, bool]:
        """(crop box (top, left, height, width), the whole image without a crop; flip) for one example: the CPU
        generator seeded with `seed` as engine.train seeds each example, then the pipeline's own transforms draw,
        in their order."""
        if seed is not None:
            torch.random.default_generator.manual_seed(seed)
        box = (0, 0, height, width)
        if self.crop is not None:
            if self._shape_probe is None or tuple(self._shape_probe.shape[-2:]) != (height, width):
                self._shape_probe = tv_tensors.Image(torch.empty(3, height, width, dtype=torch.uint8))
            p = self.crop.make_params([self._shape_probe])
            box = (p["top"], p["left"], p["height"], p["width"])
        # RandomHorizontalFlip draws before anything else and flips when the draw is below p
        flip = self.flip is not None and bool(torch.rand(1) < self.flip.p)
        return box, flip

    def draw_batch(self, seeds, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every example's draws as two CPU tensors: boxes (n, 4) int64 (top, left, height, width; the whole image
        without a crop) and flips (n,) bool."""
        draws = [self.draws(s, height, width) for s in seeds]
        boxes = torch.tensor([d[0] for d in draws], dtype=torch.int64).reshape(-1, 4)
        return boxes, torch.tensor([d[1] for d in draws], dtype=torch.bool)

    def batch(self, prepared: torch.Tensor, seeds=None) -> torch.Tensor:
        """float32 (B, C, res, res), normalised, from `prepared` rows (uint8, after `prepare`), each example with
        its seed's draws (`seeds` None: a deterministic pipeline)."""
        if not self.random:
            return self.apply(prepared)
        n, _, h, w = prepared.shape
        return self.apply(prepared, *self.draw_batch(seeds if seeds is not None else [None] * n, h, w))

    def apply(self, prepared: torch.Tensor, boxes=None, flips=None) -> torch.Tensor:
        """The random ops from given draws (`draw_batch`), then the scaling, batched on `prepared`'s device (uint8
        rows after `prepare`): a random crop and a flip are one gather of uint8 pixels (the per-example pipeline's
        pixels exactly); a random resized crop (inception) is torchvision's roi_align, bilinear samples averaged
        per output pixel, which differs from the per-example antialiased resize by interpolation only; the
        scaling runs in place (data.pixels.normalise_uint8)."""
        x = prepared
        device = x.device
        n, c, h, w = x.shape
        if self.crop is None or isinstance(self.crop, v2.RandomCrop):
            # crop and flip as one gather of uint8 pixels: each output pixel's source, flipped columns read
            # right to left
            size = (h, w) if self.crop is None else tuple(int(v) for v in self.crop.size)
            boxes = torch.zeros(n, 4, dtype=torch.int64) if boxes is None else boxes
            flips = torch.zeros(n, dtype=torch.bool) if flips is None or self.flip is None else flips
            if self.crop is not None or bool(flips.any()):
                boxes, flips = boxes.to(device, non_blocking=True), flips.to(device, non_blocking=True)
                rows = torch.arange(size[0], device=device)
                cols = torch.arange(size[1], device=device)
                cols = torch.where(flips[:, None], size[1] - 1 - cols, cols)  # (n, width)
                source = (boxes[:, :1, None] + rows[:, None]) * w + boxes[:, 1:2, None] + cols[:, None, :]
                index = source.reshape(n, 1, -1).expand(n, c, -1)
                x = x.reshape(n, c, h * w).gather(2, index).view(n, c, *size)
        else:
            x = resized_crops(x, boxes.to(device, non_blocking=True), tuple(self.crop.size))
            if self.flip is not None:
                flips = flips.to(device, non_blocking=True)
                x = torch.where(flips[:, None, None, None], x.flip(-1), x)
        return normalise_uint8(x, self.pixels)


def resized_crops(images: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Each uint8 image's box (top, left, height, width) resized to `size`, as one batched roi_align (bilinear;
    an adaptive number of samples per output pixel, so a large box is averaged rather than aliased), rounded back
    to uint8 like the per-example resize."""
    from torchvision.ops import roi_align

    n = len(images)
    top, left, h, w = boxes.to(torch.float32).unbind(1)
    rois = torch.stack([torch.arange(n, device=images.device, dtype=torch.float32), left, top, left + w, top + h], 1)
    out = roi_align(images.float(), rois, size, spatial_scale=1.0, sampling_ratio=-1, aligned=True)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def eval_transform(
    resolution: int,
    resize_small: int | None = None,
    resize_square: int | None = None,
    *,
    pixels: str = DEFAULT_PIXELS,
    flip: bool = False,
) -> ImageTransform:
    """`resize_small`: short side to that size, then a central crop; `resize_square`: both sides to that size,
    then a central crop (big_vision's `resize(256)|central_crop(224)`: few-shot, LiT's zero-shot images).
    `flip`: every image mirrored left-right (a deterministic second view)."""
    if resize_square:
        size = [v2.Resize((resize_square, resize_square)), v2.CenterCrop(resolution)]
    elif resize_small:
        size = [v2.Resize(resize_small), v2.CenterCrop(resolution)]
    else:
        size = [v2.Resize((resolution, resolution))]
    if flip:
        size.append(v2.RandomHorizontalFlip(p=1.0))
    return ImageTransform([v2.ToImage(), *size], pixels=pixels)


def train_transform(
    resolution: int, augment: str = "crop_flip", *, pixels: str = DEFAULT_PIXELS, randaug=None
) -> ImageTransform:
    """`augment` (the crop and flip), then `randaug` (a torchvision RandAugment, AugReg pretraining's
    `randaug(2, m)` after `flip_lr`), then the pixel normalisation."""
    if augment not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {augment!r}; choose one of {AUGMENTATIONS}")
    prefix: list = [v2.ToImage()]
    crop = None
    if augment.startswith("inception"):
        crop = v2.RandomResizedCrop(resolution, scale=(0.05, 1.0))
    elif "crop" in augment:
        prefix.append(v2.Resize((resolution * 8 // 7, resolution * 8 // 7)))
        crop = v2.RandomCrop(resolution)
    else:
        prefix.append(v2.Resize((resolution, resolution)))
    return ImageTransform(
        prefix, crop, v2.RandomHorizontalFlip() if "flip" in augment else None, pixels=pixels, post=randaug
    )
