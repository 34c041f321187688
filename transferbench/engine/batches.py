"""Batch streams: seeded training batches (epochs of a fixed permutation, per-example seeds for augmentation), tensor
batches, evaluation batches in order, arrays of uint8 pixels."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np
import torch

from ..data.pixels import DEFAULT_PIXELS, normalise_uint8
from ..settings.base import EVAL_BATCH

log = logging.getLogger("transferbench")


def examples(dataset) -> Callable[[int], tuple]:
    """i -> (image, label). An image folder's images come as uint8 CHW tensors of pixels it decodes once, at their
    first visit (`pixels`); an in-memory set without them (`array()` only) is decoded whole; other datasets (tfds)
    are read lazily as PIL images."""
    if hasattr(dataset, "pixels"):
        labels = np.asarray(dataset.labels)
        return lambda i: (torch.from_numpy(dataset.pixels(i)).permute(2, 0, 1), int(labels[i]))
    if hasattr(dataset, "array"):
        arr, labels = torch.from_numpy(dataset.array()).permute(0, 3, 1, 2), np.asarray(dataset.labels)
        return lambda i: (arr[i], int(labels[i]))
    return lambda i: dataset[i]


class _Seeded(torch.utils.data.Dataset):
    """Maps (index, seed) to (transform(image), label) with the transform's randomness seeded per
    example. Workers and the main process produce the same tensors. With `joint` the transform takes
    and returns (image, target) together: a segmentation mask goes through the same random resize,
    crop and flip as its image."""

    def __init__(self, dataset, transform, joint: bool = False):
        self.dataset, self.transform, self.joint, self.fetch = dataset, transform, joint, None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item):
        if self.fetch is None:  # built lazily: in a worker, after the fork
            self.fetch = examples(self.dataset)
        i, seed = item
        image, label = self.fetch(i)
        if seed is not None:
            # the CPU generator alone: torch.manual_seed also seeds CUDA, which on a CUDA build without an
            # initialised GPU formats a stack trace per call (about 1 ms an example)
            torch.random.default_generator.manual_seed(seed)
        if self.joint:
            return self.transform(image, label)
        return self.transform(image), label


class _EpochSampler(torch.utils.data.Sampler):
    """Successive seeded permutations of the dataset (shuffle + repeat), each index with its example seed."""

    def __init__(self, n: int, seed: int, total: int):
        self.n, self.seed, self.total = n, seed, total

    def __len__(self) -> int:
        return self.total

    def __iter__(self):
        epoch, given = 0, 0
        while given < self.total:
            rng = np.random.default_rng([self.seed, epoch])
            order, seeds = rng.permutation(self.n), rng.integers(0, 2**62, self.n)
            for i, s in zip(order.tolist(), seeds.tolist()):
                if given == self.total:
                    return
                yield i, s
                given += 1
            epoch += 1


def batched(dataset, transform) -> bool:
    """Whether a dataset and transform take the batched evaluation path: an in-memory set (decoded once into an
    array of equal-size images) and a transform that can run on a whole batch (data.transforms.ImageTransform)."""
    return hasattr(dataset, "array") and hasattr(transform, "batch") and getattr(transform, "batchable", True)


class Batches:
    """An iterator of training batches that says which data path made them (`info()`: engine.resident.Plan)."""

    def __init__(self, it: Iterator, plan):
        self.it, self.plan = it, plan

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.it)

    def info(self) -> dict:
        return self.plan.info()


def train_batches(
    dataset,
    transform,
    *,
    batch: int,
    steps: int,
    seed: int,
    workers: int = 0,
    joint: bool = False,
    per_example: bool = False,
    device: str = "cpu",
) -> Batches:
    """`steps` batches of (images, labels) from the shuffled, repeated dataset; `joint`: the transform
    maps (image, target) pairs (segmentation). A small set (engine.resident: under RESIDENT_BYTES once resized) is
    decoded once, held on `device`, and augmented there a batch at a time from the same per-example seeds and
    draws (the per-example path's tensors; an inception crop's up to interpolation); `per_example` forces the
    worker pipeline, for the tests and benchmarks that compare the two."""
    from . import resident

    sampler = _EpochSampler(len(dataset), seed, batch * steps)
    if joint:
        chosen = resident.Plan("workers", 0, "joint image-and-target transforms run per example")
    elif per_example:
        chosen = resident.Plan("workers", 0, "the per-example path was asked for")
    else:
        chosen = resident.plan(dataset, transform)
    log.debug("training data path: %s (%s)", chosen.path, chosen.why)
    if chosen.path == "resident":
        data = resident.images(dataset, transform, workers=workers)
        it = resident.batches(data, transform, sampler, batch=batch, device=device, workers=workers)
        return Batches(it, chosen)
    loader = torch.utils.data.DataLoader(
        _Seeded(dataset, transform, joint),
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        persistent_workers=False,
        prefetch_factor=4 if workers else None,
        pin_memory=str(device).startswith("cuda"),
    )
    return Batches(iter(loader), chosen)


def tensor_batches(*tensors: torch.Tensor, batch: int, steps: int, seed: int) -> Iterator:
    """`steps` batches of rows of `tensors` (same first dimension: e.g. tokens and cached image features)
    in the order `train_batches` visits a dataset of that size: successive seeded permutations, drawn one
    epoch at a time (a paper-scale run's 20M indices are never listed at once)."""
    n = len(tensors[0])
    pending, epoch = np.empty(0, np.int64), 0
    for _ in range(steps):
        while len(pending) < batch:  # _EpochSampler's order: the permutation is each epoch's first draw
            pending = np.concatenate([pending, np.random.default_rng([seed, epoch]).permutation(n)])
            epoch += 1
        idx, pending = torch.from_numpy(pending[:batch]), pending[batch:]
        yield tuple(t[idx] for t in tensors)


class _InOrder(_Seeded):
    """Index -> (transform(image), label) without reseeding: evaluation transforms are deterministic."""

    def __getitem__(self, i):
        return super().__getitem__((i, None))


def eval_batches(
    dataset, transform, *, batch: int = EVAL_BATCH, workers: int = 0, per_example: bool = False
) -> Iterator:
    if not per_example and batched(dataset, transform):
        return _array_eval_batches(dataset, transform, batch)
    return iter(
        torch.utils.data.DataLoader(_InOrder(dataset, transform), batch_size=batch, shuffle=False, num_workers=workers)
    )


def _array_eval_batches(dataset, transform, batch: int) -> Iterator:
    images = torch.from_numpy(dataset.array()).permute(0, 3, 1, 2)
    labels = torch.as_tensor(np.asarray(dataset.labels), dtype=torch.int64)
    for i in range(0, len(images), batch):
        yield transform.batch(transform.prepare(images[i : i + batch])), labels[i : i + batch]


def array_batches(images: np.ndarray, labels, *, batch: int = EVAL_BATCH, pixels: str = DEFAULT_PIXELS) -> Iterator:
    """Batches of uint8 (N, H, W, 3) images already at the input size, normalised as the eval transform
    normalises them (`pixels`, data.pixels), converted a batch at a time."""
    labels = np.asarray(labels)
    for i in range(0, len(images), batch):
        x = torch.from_numpy(np.array(images[i : i + batch])).permute(0, 3, 1, 2)  # a copy: memmaps are read-only
        yield normalise_uint8(x, pixels), labels[i : i + batch]
