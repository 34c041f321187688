"""Semantic-segmentation data: three readers behind one interface, and the transforms that move an image
and its mask together.

Every reader yields (image, mask): image an RGB PIL image, mask a uint8 (H, W) array of train ids
(0..K-1, 255 = ignore) at the image's own size. The label convention of ADE20K (mmseg's
`reduce_zero_label`): stored 0 ("other") -> 255, 1..150 -> 0..149.

- `AdeFolder`: the official layout that mmsegmentation and Segmenter users already have,
  `ADEChallengeData2016/{images,annotations}/{training,validation}/NAME.{jpg,png}`;
- `TfdsSegmentation`: a prepared tfds dataset through `tfds.data_source` (`scene_parse150`); its
  annotation is tfds's 3-channel PNG of the Places Challenge 2017 *instance* masks, whose red channel is
  the category (1..100 of the instance task, 0 = none) — not the 150 scene-parsing classes;
- `SegFolderDataset`: the folder format of `transferbench.data.folder` with a mask per image (the
  embedded `scenes` set), sha256-verified like every folder dataset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .folder import INFO, DataMissingError, read_info, read_split, verify_files
from .pixels import DEFAULT_PIXELS, normalise_uint8, stats

IGNORE = 255
ADE_ROOT = "ADEChallengeData2016"
ADE_SPLITS = {"train": "training", "training": "training", "validation": "validation", "val": "validation"}
OBTAIN_ADE = (
    "download ADEChallengeData2016.zip from http://data.csail.mit.edu/places/ADEchallenge/ "
    "(as https://github.com/open-mmlab/mmsegmentation/blob/main/docs/en/user_guides/2_dataset_prepare.md says) and "
    "unzip it there"
)


def reduce_zero_label(mask: np.ndarray) -> np.ndarray:
    """ADE20K's convention: 0 ("other") -> 255 (ignored), k -> k - 1 (uint8 arithmetic wraps 0 to 255)."""
    return (np.asarray(mask, dtype=np.uint8) - np.uint8(1)).astype(np.uint8)


def _as_labels(mask: np.ndarray, reduce_zero: bool) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.ndim == 3:  # tfds' scene_parse150 annotation: the category is the red channel
        mask = mask[..., 0]
    mask = mask.astype(np.uint8)
    return reduce_zero_label(mask) if reduce_zero else mask


class SegDataset(torch.utils.data.Dataset):
    """Common surface: len, (PIL image, uint8 mask) items, `num_classes`."""

    num_classes: int = 0
    reduce_zero: bool = False

    def image(self, i: int) -> Image.Image:
        raise NotImplementedError

    def raw_mask(self, i: int) -> np.ndarray:
        raise NotImplementedError

    def mask(self, i: int) -> np.ndarray:
        return _as_labels(self.raw_mask(i), self.reduce_zero)

    def __getitem__(self, i: int):
        return self.image(i), self.mask(i)


def find_ade_root(data_dir) -> Path | None:
    """`--data-dir` itself when it is ADEChallengeData2016, else its ADEChallengeData2016 child."""
    if data_dir is None:
        return None
    d = Path(data_dir).expanduser()
    for cand in (d, d / ADE_ROOT):
        if (cand / "images").is_dir() and (cand / "annotations").is_dir():
            return cand
    return None


class AdeFolder(SegDataset):
    """`<root>/images/<split>/*.jpg` with `<root>/annotations/<split>/<same stem>.png`."""

    def __init__(self, root, split: str, *, num_classes: int = 150, reduce_zero: bool = True):
        self.root = Path(root)
        self.split = ADE_SPLITS.get(split, split)
        self.num_classes, self.reduce_zero = num_classes, reduce_zero
        images = self.root / "images" / self.split
        masks = self.root / "annotations" / self.split
        if not images.is_dir() or not masks.is_dir():
            raise DataMissingError(
                f"ADE20K split {self.split!r} not found: looked for {images} and {masks} "
                f"(the layout {ADE_ROOT}/{{images,annotations}}/{{training,validation}}); " + OBTAIN_ADE
            )
        self.images = sorted(p for p in images.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        self.masks = [masks / f"{p.stem}.png" for p in self.images]
        lacking = [p.name for p in self.masks if not p.is_file()]
        if lacking or not self.images:
            what = f"{len(lacking)} annotations are missing (first: {lacking[0]})" if lacking else "no images"
            raise DataMissingError(
                f"ADE20K split {self.split!r} under {self.root} is incomplete: {what}; "
                "every images/<split>/NAME.jpg needs annotations/<split>/NAME.png"
            )

    def __len__(self) -> int:
        return len(self.images)

    def image(self, i: int) -> Image.Image:
        with Image.open(self.images[i]) as im:
            return im.convert("RGB")

    def raw_mask(self, i: int) -> np.ndarray:
        with Image.open(self.masks[i]) as m:
            return np.asarray(m)


class TfdsSegmentation(SegDataset):
    """A prepared tfds segmentation dataset (`image`, `annotation`) through tfds.data_source."""

    def __init__(self, name: str, split: str, *, data_dir=None, num_classes: int, reduce_zero: bool = True):
        from .tfds_source import TfdsDataset

        self.base = TfdsDataset(name, split, label_fn=lambda ex: 0, data_dir_=data_dir)
        self.num_classes, self.reduce_zero = num_classes, reduce_zero

    def __len__(self) -> int:
        return len(self.base)

    def image(self, i: int) -> Image.Image:
        return self.base[i][0]

    def raw_mask(self, i: int) -> np.ndarray:
        return np.asarray(self.base.example(i)["annotation"])


class SegFolderDataset(SegDataset):
    """A split of the folder format whose list lines are `images/... masks/...` (masks stored as they
    are read: train ids, 255 = ignore; or with 0 = ignore when the set's info says reduce_zero_label)."""

    def __init__(self, root, name: str, split: str, *, verify: bool = True):
        """`split`: a list's name, or tfds slicing over the lists (`training[:384]`, `training[384:]+validation`)."""
        self.dir, self.name, self.split = Path(root) / name, name, split

        def check(lst: Path, lines: list[str]) -> None:
            if any(len(r) != 2 or r[1].lstrip("-").isdigit() for r in (line.split(" ") for line in lines)):
                raise DataMissingError(
                    f"{lst} is not a segmentation list (lines 'images/... masks/...'); regenerate the set"
                )

        lines = read_split(
            self.dir,
            split,
            lambda where: DataMissingError(f"segmentation set {name!r} split {split!r} not found: looked for {where}"),
            verify=(lambda lists: verify_files(self.dir, name, [*lists, INFO])) if verify else None,
            check=check,
        )
        rows = [line.split(" ") for line in lines]
        self.paths, self.mask_paths = [r[0] for r in rows], [r[1] for r in rows]
        self.info = read_info(root, name)
        self.num_classes = int(self.info.get("num_classes", 0))
        self.reduce_zero = bool(self.info.get("reduce_zero_label", False))
        self._cache: dict[int, tuple] = {}  # small sets are revisited every epoch: decode once
        if verify:
            verify_files(self.dir, name, [*self.paths, *self.mask_paths])

    def __len__(self) -> int:
        return len(self.paths)

    def _load(self, i: int):
        if i not in self._cache:
            with Image.open(self.dir / self.paths[i]) as im:
                img = np.array(im.convert("RGB"))  # writable: torch.from_numpy shares it
            with Image.open(self.dir / self.mask_paths[i]) as m:
                mask = np.asarray(m)
            self._cache[i] = img, mask
        return self._cache[i]

    def image(self, i: int) -> Image.Image:
        return Image.fromarray(self._load(i)[0])

    def raw_mask(self, i: int) -> np.ndarray:
        return self._load(i)[1]

    def __getitem__(self, i: int):
        """(uint8 (3, H, W) tensor, mask): the decoded array as it is, no PIL round trip per epoch."""
        return torch.from_numpy(self._load(i)[0]).permute(2, 0, 1), self.mask(i)


# --- transforms ------------------------------------------------------------------------------------


def _cat_max_crop_class():
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    class CatMaxRandomCrop(v2.RandomCrop):
        """v2.RandomCrop with mmseg's `cat_max_ratio`: a crop in which one class covers at least that share of
        the labelled pixels (the ignore index and padding left out) is drawn again, up to 10 times; the
        draw after the tenth is kept whatever it holds (mmseg's RandomCrop). 1.0 turns it off."""

        def __init__(self, size, cat_max_ratio: float, ignore_index: int = IGNORE, **kwargs):
            super().__init__(size, **kwargs)
            self.cat_max_ratio, self.ignore_index = cat_max_ratio, ignore_index

        def make_params(self, flat_inputs):
            params = super().make_params(flat_inputs)
            mask = next((x for x in flat_inputs if isinstance(x, tv_tensors.Mask)), None)
            if mask is None or self.cat_max_ratio >= 1:
                return params
            mask = mask.as_subclass(torch.Tensor)  # plain tensor ops: no tv_tensor dispatch per call
            for _ in range(10):
                pad_left, pad_top = params["padding"][0], params["padding"][1]
                r0, c0 = params["top"] - pad_top, params["left"] - pad_left
                region = mask[
                    ..., max(r0, 0) : max(r0 + params["height"], 0), max(c0, 0) : max(c0 + params["width"], 0)
                ]
                counts = torch.bincount(region[region != self.ignore_index].reshape(-1).long())
                counts = counts[counts > 0]
                if len(counts) > 1 and counts.max() / counts.sum() < self.cat_max_ratio:
                    break
                params = super().make_params(flat_inputs)
            return params

    return CatMaxRandomCrop


def train_transform(
    crop: int,
    *,
    ratio: tuple[float, float],
    cat_max_ratio: float,
    base: int | None = None,
    photometric: bool = True,
    pixels: str = DEFAULT_PIXELS,
):
    """mmseg's ADE20K training pipeline with torchvision v2 on (Image, Mask) pairs: random resize of the
    short side to base·r, r uniform in `ratio` (base: the crop size; mmseg's scale (2048, 512) with
    ratio 0.5-2.0 does the same for images of aspect below 4), random crop (padded with 0 / the ignore
    index where the image is smaller), horizontal flip, photometric distortion (mmseg's PhotoMetricDistortion
    with torchvision's ColorJitter: brightness, contrast, saturation and hue, each applied with p = 0.5, at
    mmseg's ranges; brightness is a factor 0.875-1.125 where mmseg adds +-32 of 255, and contrast always
    comes first where mmseg puts it before or after the HSV steps at random), pixels normalised as `pixels` says
    (data.pixels). Masks
    resize with nearest neighbours (v2 does so for every tv_tensors.Mask). Call it as
    `transform(image, mask)`. The crop is mmseg's RandomCrop with `cat_max_ratio` (`CatMaxRandomCrop`)."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    base = base or crop
    lo, hi = int(round(base * ratio[0])), int(round(base * ratio[1]))
    ops = [
        v2.RandomResize(lo, hi + 1),
        _cat_max_crop_class()(
            crop, cat_max_ratio=cat_max_ratio, pad_if_needed=True, fill={tv_tensors.Image: 0, tv_tensors.Mask: IGNORE}
        ),
        v2.RandomHorizontalFlip(),
    ]
    if photometric:  # mmseg's PhotoMetricDistortion: each with p = 0.5; hue +-18 of OpenCV's 180 = 0.1 of the circle
        ops += [
            v2.RandomApply([v2.ColorJitter(**{name: span})], p=0.5)
            for name, span in (
                ("brightness", (0.875, 1.125)),
                ("contrast", (0.5, 1.5)),
                ("saturation", (0.5, 1.5)),
                ("hue", (-0.1, 0.1)),
            )
        ]
    mean, std = stats(pixels)
    ops += [
        v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64}, scale=True),
        v2.Normalize(list(mean), list(std)),
    ]
    pipeline = v2.Compose(ops)

    def apply(image, mask):
        img = tv_tensors.Image(v2.functional.pil_to_tensor(image) if isinstance(image, Image.Image) else image)
        return pipeline(img, tv_tensors.Mask(torch.as_tensor(np.asarray(mask))))

    apply.pipeline = pipeline
    return apply


def eval_size(height: int, width: int, short: int, long: int | None = None) -> tuple[int, int]:
    """mmseg's `Resize(scale=(long, short), keep_ratio=True)` (mmcv.rescale_size): one factor
    min(long / long side, short / short side), sizes rounded half up. Default long = 4 * short
    (ADE20K: 2048, 512)."""
    long = long or 4 * short
    factor = min(long / max(height, width), short / min(height, width))
    return int(height * factor + 0.5), int(width * factor + 0.5)


def eval_image(image, short: int, device=None, pixels: str = DEFAULT_PIXELS) -> torch.Tensor:
    """The test pipeline's image: resized as `eval_size` says (bilinear on the uint8 image, rounded back to
    uint8, as mmcv's cv2 resize: no antialiasing), then normalised as `pixels` says: (3, h, w) float on `device`
    (moved there as uint8, before resizing)."""
    from torchvision.transforms import v2

    x = v2.functional.pil_to_tensor(image) if isinstance(image, Image.Image) else torch.as_tensor(image)
    if device is not None and torch.device(device).type == "cuda" and x.device.type == "cpu":
        # pinned and asynchronous: a pageable copy would make the host wait for the GPU's queued windows
        x = x.pin_memory().to(device, non_blocking=True)
    elif device is not None:
        x = x.to(device)
    h, w = eval_size(x.shape[-2], x.shape[-1], short)
    x = v2.functional.resize(x, [h, w], antialias=False) if (h, w) != tuple(x.shape[-2:]) else x
    if pixels == "inception":  # the arithmetic the committed ADE20K records were made with
        return x.float().div_(127.5).sub_(1.0)
    return normalise_uint8(x, pixels)
