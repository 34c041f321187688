"""Frozen features, extracted once and cached by content.

The cache key hashes everything that determines the features: the backbone name and its weights' sha256, the
representation (pre-logits, and which pooling), the transform (resolution, resize, pixel range, bf16), the dataset
(name, source, tfds name or embedded set, data version), the split, and the fingerprint of the code and libraries
that compute them (`code`: the extractor, the data readers and transforms, the backbone family's modules and a `py:`
model's own). Change any one and the cache misses. Entries are `.npz` files (features float32, labels int64) under
$TRANSFERBENCH_HOME/features, written atomically with their size and checksum beside them (`KEY.npz.digest`),
checked before a hit is read: a damaged entry is set aside and computed again (paths.entries.verified).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from ..arithmetic import output
from ..backbones.registry import backbone_code
from ..fingerprint import Fingerprint, for_cache
from ..paths.entries import sealed, verified
from ..paths.home import cache
from ..settings.base import EVAL_BATCH
from .evaluate import Evaluation

log = logging.getLogger("transferbench")


def cache_dir() -> Path:
    return cache("features")


def precision(setting, device: str, *, backbone: str, resolution: int, pool: str, build, batch: int = EVAL_BATCH):
    """bf16 or fp32 for extracting this backbone's features (engine.precision: `auto` probes a forward of
    `batch` images on a cache miss of its own; `build()` makes the model only then)."""
    from .precision import forward_step, probe_images, resolve

    def make_step():
        model = build().eval().to(device)
        return forward_step(
            lambda b: model.forward_head(model.forward_features(b), pre_logits=True),
            probe_images(batch, resolution),
            device,
        )

    return resolve(
        setting,
        device,
        {"mode": "features", "backbone": backbone, "resolution": resolution, "pool": pool, "batch": batch},
        make_step,
    )


def code(backbone: str) -> Fingerprint:
    """The fingerprint of what computes backbone `backbone`'s features (fingerprint.CACHE_CODE['features'])."""
    return for_cache("features", *backbone_code(backbone))


def cache_key(
    *, backbone: str, weights_sha256: str, transform: dict, dataset: dict, split: str, pool: str = "model"
) -> str:
    """`pool`: the backbone's own pre-logits ('model') or the named pooling ('tok', 'gap')."""
    from ..hashing import digest

    representation = "pre_logits" if pool == "model" else f"pre_logits:{pool}"
    ident = {
        "code": code(backbone).digest,
        "backbone": backbone,
        "weights": weights_sha256,
        "representation": representation,
        "transform": transform,
        "dataset": dataset,
        "split": split,
    }
    return digest(ident)


@torch.inference_mode()
def extract(model, dataset, transform, how: Evaluation) -> tuple[np.ndarray, np.ndarray]:
    """Pre-logits features (B, D) and labels of every example, batched, in order."""
    from .batches import eval_batches

    model.eval().to(how.device)
    batches = eval_batches(dataset, transform, batch=how.batch, workers=how.workers)
    total = (len(dataset) + how.batch - 1) // how.batch
    feats, labels = _forward(model, batches, how, total)
    return feats, np.concatenate([np.asarray(y, dtype=np.int64) for y in labels])


@torch.inference_mode()
def extract_pairs(model, pairs, transform, how: Evaluation) -> tuple[np.ndarray, np.ndarray]:
    """Pre-logits (N, D) and captions (a unicode array) of an ordered stream of (image, caption) pairs
    (data.image_text readers). Decoding runs in at most one worker, so the order is the reader's."""
    model.eval().to(how.device)
    stream = _PairStream(pairs, transform)
    loader = torch.utils.data.DataLoader(stream, batch_size=how.batch, num_workers=min(1, how.workers))
    feats, captions = _forward(model, loader, how, None)
    return feats, np.array([c for cs in captions for c in cs], dtype=np.str_)


class _PairStream(torch.utils.data.IterableDataset):
    def __init__(self, pairs, transform):
        self.pairs, self.transform = pairs, transform

    def __iter__(self):
        return ((self.transform(image), caption) for image, caption in self.pairs)


def _forward(model, batches, how: Evaluation, total) -> tuple[np.ndarray, list]:
    from .precision import autocast

    feats, labels = [], []
    for x, y in how.progress(batches, total=total, desc=how.desc) if how.progress else batches:
        with autocast(how.device, how.bf16):
            f = model.forward_head(model.forward_features(x.to(how.device)), pre_logits=True)
        feats.append(f.float().cpu().numpy())
        labels.append(y)
    if not feats:
        raise ValueError(f"{how.desc}: no examples")
    return np.concatenate(feats), labels


def cached(key: str, compute) -> tuple[np.ndarray, np.ndarray, bool]:
    """(features, labels, hit): from the cache, or computed by `compute()` and stored."""
    path = cache_dir() / f"{key}.npz"
    if verified(path, "feature cache entry"):
        log.info("features from the cache: %s", path)
        with np.load(path) as z:
            return z["features"], z["labels"], True
    feats, labels = compute()
    labels = _labels(labels)
    with sealed(path, suffix=".npz") as tmp:  # savez appends .npz to a name without it
        np.savez(tmp, features=feats.astype(np.float32), labels=labels)
    return feats.astype(np.float32), labels, False


def _labels(labels) -> np.ndarray:
    """Class labels as int64; captions (image-text pairs) as a unicode array, stored without pickling."""
    labels = np.asarray(labels)
    return labels.astype(np.str_) if labels.dtype.kind in "USO" else labels.astype(np.int64)


class FrozenFeatures:
    """A cell's backbone as a locked feature extractor (few-shot probes, LiT's image tower): built only on a cache
    miss, from one fixed draw (seed 0: a random-init backbone's features are cached under 'random-init'), run in
    bf16 where that measures faster (`precision`), and every extraction cached by content (`cache_key`).

    `transform(**fields)` is the cache's description of an input pipeline (resolution, pixels and bf16 with
    `fields`); `split(...)` and `pairs(...)` return cached (features, labels or captions, hit, key)."""

    def __init__(self, cell, *, resolution: int, pixels: str, pool: str, bf16, device: str, workers=0, progress=None):
        self.cell, self.name = cell, cell.backbone_name
        self.resolution, self.pixels, self.pool = int(resolution), pixels, pool
        self.device, self.workers, self.progress = device, workers, progress
        self._model = None
        self.choice = precision(
            bf16, device, backbone=self.name, resolution=self.resolution, pool=pool, build=self.model
        )
        self.bf16 = self.choice.bf16

    @classmethod
    def of(cls, cell, s, ctx) -> FrozenFeatures:
        """A cell's extractor with a protocol's settings `s` (resolution, pixels, pool, bf16) in context `ctx`."""
        run = {"device": ctx.device, "workers": ctx.workers, "progress": ctx.progress}
        return cls(cell, resolution=s.resolution, pixels=s.pixels, pool=s.pool, bf16=s.bf16, **run)

    def model(self):
        if self._model is None:
            from ..backbones import create_backbone

            torch.manual_seed(0)
            self._model = create_backbone(
                self.name,
                img_size=self.resolution,
                checkpoint=self.cell.checkpoint,
                **({} if self.pool == "model" else {"pool": self.pool}),
            )
            self._model.requires_grad_(False).eval()
        return self._model

    def transform(self, **fields) -> dict:
        return {"resolution": self.resolution, **fields, "pixels": self.pixels, "bf16": self.bf16}

    def _cached(self, identity: dict, split: str, transform_id: dict, compute):
        key = cache_key(
            backbone=self.name,
            weights_sha256=self.cell.checkpoint_sha256,
            transform=transform_id,
            dataset=identity,
            split=split,
            pool=self.pool,
        )
        features, labels, hit = cached(key, compute)
        output(f"features.{split}", features)
        return features, labels, hit, key

    def _how(self, desc: str) -> Evaluation:
        return Evaluation(self.device, self.bf16, workers=self.workers, progress=self.progress, desc=desc)

    def split(self, data, identity: dict, split: str, transform, transform_id: dict, desc: str):
        """(features, labels, hit, key) of every example of `data` (read only on a miss)."""
        compute = lambda: extract(self.model(), data, transform, self._how(desc))  # noqa: E731
        return self._cached(identity, split, transform_id, compute)

    def pairs(self, reader, identity: dict, transform, transform_id: dict, desc: str):
        """(features, captions, hit, key) of an image-text pair stream (`reader()` opens it on a miss)."""
        compute = lambda: extract_pairs(self.model(), reader(), transform, self._how(desc))  # noqa: E731
        return self._cached(identity, "pairs", transform_id, compute)
