"""Small training sets held decoded on the training device.

A fine-tuning cell revisits the same images hundreds of times (VTAB-1k: 1,000 images, 2,500 steps of 512, so
every image about 1,280 times). When the split, after the deterministic head of its training transform (the
resize to the crop's source size), fits in `RESIDENT_BYTES` of uint8 pixels, it is decoded once, held on the
training device, and each batch is one gather plus the random ops applied to the whole batch there
(data.transforms.ImageTransform.apply). The random draws are the per-example pipeline's own: each example's
seed, then the pipeline's transforms drawing in their order; they are drawn in the DataLoader workers (a few
integers per example) while the device works. So crops and flips are the per-example pipeline's pixels exactly;
an inception crop differs by interpolation only (roi_align against the antialiased resize).

Where the switch is, and why there:
- `RESIDENT_BYTES` = 1 GiB of prepared pixels. VTAB-1k at 224 px is 1,000 x 3 x 256 x 256 = 197 MB, and at
  384 px (a crop from 438 px) 576 MB; ImageNet-1k's 1.28 M images at 256 px would be 252 GB and ADE20K's 20,210
  at 512 px 15.9 GB. 1 GiB is small against any training GPU's memory (and against the 1/k share of
  several slots on one GPU on an 80 GB device), and large against every few-shot and VTAB-1k split.
- Sets whose images keep their own sizes up to the random op (an inception crop on a source without a fixed
  size: the crop box is drawn on each image's own size) and pipelines with per-example ops (RandAugment) keep
  the worker pipeline, as do segmentation's joint image-and-mask transforms.

Sources that must be decoded (tfds) are cached on disk under $TRANSFERBENCH_HOME/decoded by content (the
source's identity and the resize), like features: the 9 cells of a VTAB task decode it once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from ..fingerprint import for_cache
from ..hashing import digest
from ..paths.entries import sealed, verified
from ..paths.home import cache

log = logging.getLogger("transferbench")
RESIDENT_BYTES = 1 << 30


@dataclass
class Plan:
    """Which path a training set takes: 'resident' (decoded once, on the device) or 'workers' (the per-example
    pipeline in DataLoader workers), the prepared pixels' size in bytes (0 when unknown) and why."""

    path: str
    nbytes: int
    why: str

    def info(self) -> dict:
        return {"data_path": self.path, "data_bytes": self.nbytes}


def fixed_size(transform) -> tuple[int, int] | None:
    """The (height, width) every image has after the transform's deterministic head, or None when it keeps each
    image's own size (no resize before the random op)."""
    sizes = {_prepared_size(transform, h, w) for h, w in ((37, 53), (61, 29))}
    return sizes.pop() if len(sizes) == 1 else None


def _prepared_size(transform, height: int, width: int) -> tuple[int, int]:
    """The (height, width) the transform's deterministic head makes of an image of this size."""
    return tuple(transform.prepare(torch.zeros(1, 3, height, width, dtype=torch.uint8)).shape[-2:])


def plan(dataset, transform, *, limit: int | None = None) -> Plan:
    limit = RESIDENT_BYTES if limit is None else limit
    if not getattr(transform, "batchable", False) or not hasattr(transform, "apply"):
        return Plan("workers", 0, "the transform has per-example ops (RandAugment)")
    n = len(dataset)
    if hasattr(dataset, "array"):
        size = _prepared_size(transform, *dataset.array().shape[1:3])
    else:
        size = fixed_size(transform)
        if size is None:
            return Plan("workers", 0, "images keep their own sizes up to the random crop")
    nbytes = n * 3 * size[0] * size[1]
    if nbytes > limit:
        return Plan("workers", nbytes, f"{nbytes / 2**20:.0f} MiB of pixels is over the {limit / 2**20:.0f} MiB limit")
    return Plan("resident", nbytes, f"{n} images of {size[0]}x{size[1]} px, {nbytes / 2**20:.0f} MiB")


def images(dataset, transform, *, workers: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 (N, 3, H, W) prepared images, int64 labels) on the CPU: an in-memory set's array resized at once;
    another source decoded through the transform's head per image (in `workers`), from the disk cache when the
    source has an identity."""
    if hasattr(dataset, "array"):
        x = transform.prepare(torch.from_numpy(dataset.array()).permute(0, 3, 1, 2)).contiguous()
        return x, torch.as_tensor(np.asarray(dataset.labels), dtype=torch.int64)
    ident = dataset.identity() if hasattr(dataset, "identity") else None
    if ident is None:
        return _decode(dataset, transform, workers)
    path = cache("decoded") / f"{decoded_key(ident, transform)}.npz"
    if verified(path, "decoded training set"):
        log.info("decoded training set from the cache: %s", path)
        with np.load(path) as z:
            return torch.from_numpy(z["images"]), torch.from_numpy(z["labels"])
    x, y = _decode(dataset, transform, workers)
    with sealed(path, suffix=".npz") as tmp:
        np.savez(tmp, images=x.numpy(), labels=y.numpy())
    return x, y


def decoded_key(identity: dict, transform) -> str:
    """A decoded split's cache key: the source's identity, the transform's deterministic head, and the fingerprint
    of the code and libraries that decode and resize it."""
    return digest(
        {"code": for_cache("decoded").digest, "dataset": identity, "head": [repr(op) for op in transform.prefix]}
    )


def _decode(dataset, transform, workers: int) -> tuple[torch.Tensor, torch.Tensor]:
    from torchvision.transforms import v2

    loader = torch.utils.data.DataLoader(
        _Decoding(dataset, v2.Compose(transform.prefix)), batch_size=256, num_workers=workers
    )
    xs, ys = zip(*loader)
    return torch.cat(xs).contiguous(), torch.cat(ys).to(torch.int64)


class _Decoding(torch.utils.data.Dataset):
    """Example i -> (the transform's deterministic head on its image as a uint8 tensor, its label)."""

    def __init__(self, dataset, head):
        self.dataset, self.head = dataset, head

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        image, label = self.dataset[i]
        return self.head(image).as_subclass(torch.Tensor), int(label)


class _Draws(torch.utils.data.Dataset):
    """(index, seed) -> (index, crop box, flip): one example's draws, as the per-example pipeline draws them
    (seeded per example; data.transforms.ImageTransform.draws)."""

    def __init__(self, transform, height: int, width: int):
        self.transform, self.height, self.width = transform, height, width

    def __len__(self) -> int:  # the sampler gives the indices
        return 0

    def __getitem__(self, item):
        i, seed = item
        box, flip = self.transform.draws(seed, self.height, self.width)
        return i, torch.tensor(box), flip


def batches(data: tuple[torch.Tensor, torch.Tensor], transform, sampler, *, batch: int, device: str, workers: int = 0):
    """Batches of (normalised float32 images, labels) on `device`, from resident `data` (uint8 images and labels,
    moved there once) and the sampler's (index, seed) stream."""
    x, y = (t.to(device) for t in data)
    _, _, h, w = x.shape
    loader = torch.utils.data.DataLoader(
        _Draws(transform, h, w),
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        pin_memory=str(device).startswith("cuda"),
        prefetch_factor=4 if workers else None,
    )
    for idx, boxes, flips in loader:
        idx = idx.to(device, non_blocking=True)
        yield transform.apply(x[idx], boxes, flips), y[idx]
