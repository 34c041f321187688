"""Clean and corrupted images of a corruption cell: released sets (folder, tfds, npy) or generated here, and the
top-1 error over them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ...data import corruptions as C
from ...data.corruptions import ImageNetCFolder, NpyCorrupted
from ...data.sources import open_split
from ...data.tfds_source import TfdsDataset
from ...data.transforms import eval_transform
from ...engine.evaluate import Evaluation, accuracy
from ...settings.finetune import CorruptionSettings


def open_clean(ds: dict, split: str, data_dir=None):
    data = open_split(ds, split, data_dir)
    if ds.get("limit") and split == ds["test"]:
        data = torch.utils.data.Subset(data, range(min(int(ds["limit"]), len(data))))
    return data


def released_path(ds: dict, data_dir) -> Path:
    p = Path(ds["path"] or "").expanduser()
    return p if p.is_absolute() or data_dir is None else Path(data_dir).expanduser() / p


def open_released(ds: dict, corruption: str, severity: int, data_dir=None):
    """One (corruption, severity) of released corrupted data (folder, npy or tfds)."""
    if ds["corrupted"] == "folder":
        return ImageNetCFolder(released_path(ds, data_dir), corruption, severity, ds["classes"])
    if ds["corrupted"] == "npy":
        return NpyCorrupted(released_path(ds, data_dir), corruption, severity, ds["classes"])
    name = ds["tfds_corrupted"].format(corruption=corruption, severity=severity)
    return TfdsDataset(name, ds["tfds_corrupted_split"], data_dir_=data_dir)


def data_identity(ds: dict, version: str) -> dict:
    return {k: ds.get(k) for k in ("name", "source", "tfds", "set", "test", "limit")} | {"version": version}


def render_size(hp: CorruptionSettings) -> int:
    """The side the corruption functions run at: `render`, else the model's resolution."""
    return int(hp.render or hp.resolution)


def rendered(ds: dict, version: str, hp: CorruptionSettings, ctx):
    """The clean test images brought to the render size as ImageNet-C's were (short side render / crop_pct,
    centre crop), and their labels: decoded once per dataset and geometry, then read from the cache by every
    severity, corruption, backbone and seed. Returns (ArraySet, hit)."""
    size = render_size(hp)

    def compute():
        data = open_clean(ds, ds["test"], ctx.data_dir)
        it = (
            ctx.progress(range(len(data)), desc=f"{ds['name']} rendering clean images")
            if ctx.progress
            else range(len(data))
        )
        pairs = [data[i] for i in it]
        return (
            np.stack([C.render(im, size, ds["crop_pct"]) for im, _ in pairs]),
            np.asarray([y for _, y in pairs], dtype=np.int64),
        )

    return C.cached(C.cache_key(data=data_identity(ds, version), render=size, crop_pct=ds["crop_pct"]), compute)


def generated(ds: dict, version: str, hp: CorruptionSettings, corruption: str, severity: int, ctx):
    """The test split under `corruption` at `severity` (severity 0: clean, through the same geometry), at the
    model's resolution, from the cache or generated from the rendered clean images. Returns (ArraySet, hit)."""
    res, size = hp.resolution, render_size(hp)
    if not severity and size == res:  # the rendered clean images are already at the model's resolution
        return rendered(ds, version, hp, ctx)
    ident = data_identity(ds, version)
    geometry = {"render": size, "crop_pct": ds["crop_pct"], "out": res}
    gen = C.generator_identity() if severity else None
    key = C.cache_key(
        data=ident, geometry=geometry, corruption=corruption if severity else "clean", severity=severity, generator=gen
    )

    def compute():
        clean = rendered(ds, version, hp, ctx)[0]
        images, labels = clean.array(), clean.labels
        if not severity:
            return C.resize(images, res), labels
        base = int(C.cache_key(data=ident)[:8], 16)
        seeds = [C.image_seed(base, i, corruption, severity) for i in range(len(images))]
        processes = ctx.workers or os.cpu_count() or 1
        return C.generate(
            images,
            corruption,
            severity,
            seeds,
            res,
            processes=processes,
            progress=ctx.progress,
            desc=f"{ds['name']} {corruption} {severity}",
        ), labels

    return C.cached(key, compute)


def top1_error(model, data, hp: CorruptionSettings, ctx, use_bf16: bool, *, resize_small: int | None = None) -> float:
    res = hp.resolution
    fast = hasattr(data, "array") and tuple(data.array().shape[1:3]) == (res, res)
    transform = None if fast else eval_transform(res, resize_small=resize_small, pixels=hp.pixels)
    how = Evaluation.of(ctx, use_bf16, batch=hp.eval_batch, pixels=hp.pixels)
    return 100.0 - accuracy(model, data, transform, how)
