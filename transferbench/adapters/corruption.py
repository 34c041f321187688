"""Corruption robustness: ImageNet-C's 15 corruptions x 5 severities and mCE as Hendrycks & Dietterich define it
(hendrycks/robustness, docs/robustness.md; the formulas are in transferbench.reporting.robustness).

Cells, per dataset and model seed:
    stage 'classifier':  the classifier under test and its clean top-1 error. With a checkpoint whose head has
                         the dataset's classes (an ImageNet-1k fine-tuned file) that head is used as it is;
                         otherwise a head is fine-tuned on the clean training split with the VTAB recipe of the
                         spec (adapters.classify.finetune, the same loop) and stored under
                         $TRANSFERBENCH_HOME/classifiers by the cell's training identity; later cells load it.
    stage 'corruption':  one per corruption, once the classifier cell is finished: top-1 error at severities
                         1-5 (metrics error_1 ... error_5; `error` is their mean).

Corrupted data (`corrupted` in the dataset entry):
    folder    the released ImageNet-C files, <data-dir>/<path>/<corruption>/<severity>/<wnid>/*.JPEG
    tfds      tfds `imagenet2012_corrupted/<corruption>_<severity>` (split validation) through tfds.data_source
    npy       CIFAR-10-C style arrays, <data-dir>/<path>/<corruption>.npy + labels.npy
    generate  the clean test split corrupted here (data.corruptions: imagecorruptions-imaug), for any dataset:
              each image brought to `render` px as ImageNet-C's were made (short side render / crop_pct, centre
              crop), corrupted there, resized to the model's resolution; seeded per image and cached by content.
The clean error of a released set comes from the clean split with the same geometry (resize to
resolution / crop_pct, centre crop); of a generated set, from the rendered clean images themselves, so that
clean and corrupted differ by the corruption alone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from ..backbones import create_backbone
from ..backbones.checkpoint import head_classes, save_checkpoint
from ..backbones.registry import backbone_code
from ..cell import make_cell
from ..data import corruptions as C
from ..data.corruptions import INSTALL, LAYOUT, ImageNetCFolder, NpyCorrupted, check_name, generator_identity
from ..data.folder import DataMissingError
from ..data.imagenet_c import ALEXNET_CLEAN_ERROR, ALEXNET_ERRORS, CORRUPTIONS  # noqa: F401 (public names)
from ..data.sources import DatasetEntry, open_split, require_tfds_name
from ..data.tfds_source import TfdsDataset
from ..data.transforms import AUGMENTATIONS, eval_transform
from ..engine.precision import for_forward
from ..engine.train import Evaluation, accuracy
from ..errors import UserError
from ..fingerprint import CORRUPT, for_cache
from ..hashing import digest
from ..paths import cache, sealed, verified
from ..reporting.robustness import REPORT, mce, relative_mce  # noqa: F401 (mce, relative_mce: public names)
from ..spec import SpecError
from .base import Adapter
from .classify import FinetuneSettings, finetune
from .settings import setting

CLASSIFIER = "App. E's fine-tuning recipe for the classifier under test (docs/robustness.md)"


class CorruptionSettings(FinetuneSettings):
    """The classifier under test (a checkpoint head with the dataset's classes, else App. E's recipe fine-tuned on
    the clean training split) and how its corrupted test images are made (hendrycks/robustness)."""

    classifier: Literal["auto", "finetune", "checkpoint"] = setting(
        "auto",
        CLASSIFIER,
        "auto: the checkpoint's head where it has the classes, else fine-tune | finetune | checkpoint",
    )
    loss: Literal["sigmoid", "softmax"] = setting(
        "softmax",
        "the classifier's loss as every record of this task ran it; App. E's sigmoid_xent is --set loss=sigmoid",
        "sigmoid: big_vision's sigmoid_xent | softmax: softmax cross-entropy",
        keyed=False,
    )
    lr: float = setting(0.01, CLASSIFIER, "learning rate of the classifier's fine-tuning", gt=0)
    eval_batch: int = setting(256, "no effect on results", "images per evaluation batch", ge=1)
    render: int | None = setting(
        None,
        "hendrycks/robustness: ImageNet-C made at 224",
        "generated corruptions: the side the 15 functions run at (null: the resolution)",
    )
    corruptions: str | list[str] = setting(
        "all", "Hendrycks & Dietterich: 15 corruptions x 5 severities", "all, or a list of names: a cell per corruption"
    )
    corruption: str | None = Field(None, json_schema_extra={"source": "", "keyed": False, "hidden": True})


TRAIN_KEYS = (
    "optimizer",
    "lr",
    "momentum",
    "weight_decay",
    "clip",
    "batch",
    "steps",
    "warmup_steps",
    "resolution",
    "bf16",
)


class CorruptionDataset(DatasetEntry):
    """A clean dataset (tfds or embedded: `test`, and `train` for fine-tuning a head) and where its corrupted
    copies come from."""

    train: str | None = None  # type: ignore[assignment]  # clean training split; None: the checkpoint's head only
    classes: int
    augment: Literal[AUGMENTATIONS] = "crop_flip"  # type: ignore[valid-type]
    crop_pct: float = 0.875  # the test images' geometry: short side resolution / crop_pct, centre crop (256 -> 224)
    corrupted: Literal["generate", "folder", "tfds", "npy"] = "generate"
    path: str | None = None  # folder / npy: under --data-dir (or absolute)
    tfds_corrupted: str = "imagenet2012_corrupted/{corruption}_{severity}"  # corrupted: tfds; a name:version pattern
    tfds_corrupted_split: str = "validation"
    baseline: Literal["alexnet", "reference"] = "reference"  # CE normalised by AlexNet's errors or the --reference's
    limit: int | None = None  # the first N test images only (the embedded suite)


def entry(cell) -> dict:
    return CorruptionDataset.model_validate({**cell.dataset_config, "name": cell.dataset}).model_dump()


def corruption_list(value) -> list[str]:
    """The spec's / --set's `corruptions`: 'all' or a list (or comma-separated string) of names."""
    if value in (None, "all"):
        return list(CORRUPTIONS)
    names = value.strip("[]").split(",") if isinstance(value, str) else list(value)
    return [check_name(str(n).strip()) for n in names]


# --- data -------------------------------------------------------------------------------------------------


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


# --- the classifier under test ----------------------------------------------------------------------------


def home_dir() -> Path:
    return cache("classifiers")


def classifier_key(cell) -> str:
    """What determines the fine-tuned classifier: backbone and weights, the clean training data, the training
    hyper-parameters and the seed (not the corruption nor how the test images are made), and the fingerprint of
    the code and libraries that fine-tune it."""
    ds = entry(cell)
    ident = {
        "code": for_cache("classifiers", *backbone_code(cell.backbone)).digest,
        "backbone": cell.backbone_name,
        "weights": cell.checkpoint_sha256,
        "data": {k: ds.get(k) for k in ("name", "source", "tfds", "set", "train", "classes", "augment")},
        "data_version": cell.data_version,
        "hp": {k: cell.hparams.get(k) for k in TRAIN_KEYS},
        "seed": cell.seed,
    }
    return digest(ident)


def classifier(cell, ctx):
    """(model, info): the checkpoint's own head when it has the dataset's classes (hparam classifier auto or
    checkpoint), else the fine-tuned head from the classifier cache, trained on a miss."""
    from filelock import FileLock

    hp, ds = CorruptionSettings.of(cell.hparams), entry(cell)
    name, mode, res = cell.backbone_name, hp.classifier, hp.resolution
    head = head_classes(cell.checkpoint) if cell.checkpoint and mode != "finetune" else None
    if head == ds["classes"]:
        model = create_backbone(name, img_size=res, num_classes=ds["classes"], checkpoint=cell.checkpoint)
        return model.to(ctx.device).eval(), {"classifier": "checkpoint head"}
    if mode == "checkpoint":
        raise UserError(
            f"backbone {cell.backbone!r}: classifier=checkpoint needs a checkpoint whose head has "
            f"{ds['classes']} classes (dataset {cell.dataset!r}); it has "
            f"{'none' if head is None else head}: use --set classifier=auto to fine-tune one"
        )
    if not ds["train"]:
        raise UserError(
            f"dataset {cell.dataset!r} has no training split to fine-tune a head on and backbone "
            f"{cell.backbone!r} has no head of {ds['classes']} classes: give NAME@CHECKPOINT with an "
            f"{ds['classes']}-class head (e.g. an ImageNet-1k fine-tuned file)"
        )
    folder = home_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = classifier_key(cell)
    path = folder / f"{key}.safetensors"
    with FileLock(str(folder / f"{key}.lock")):
        if verified(path, "classifier cache entry"):
            from safetensors import safe_open

            model = create_backbone(name, img_size=res, num_classes=ds["classes"], checkpoint=path)
            with safe_open(str(path), "pt") as f:  # the header only
                info = json.loads((f.metadata() or {}).get("info", "{}"))
            return model.to(ctx.device).eval(), {**info, "classifier_cache_hit": True}
        train = open_clean(ds, ds["train"], ctx.data_dir)
        model, info = finetune(
            cell, hp, train, ds["classes"], ds["augment"], ctx, desc=f"{cell.dataset} fine-tune seed={cell.seed}"
        )
        info = {**info, "classifier": "fine-tuned", "classifier_key": key}
        with sealed(path, suffix=".safetensors") as tmp:
            save_checkpoint(model, tmp, info=info)
    return model.eval(), {**info, "classifier_cache_hit": False}


# --- the adapter ------------------------------------------------------------------------------------------


class CorruptionAdapter(Adapter):
    name = "corruption"
    libraries = CORRUPT
    dataset_schema = CorruptionDataset
    settings = CorruptionSettings

    def validate(self, spec, source="<spec>"):
        super().validate(spec, source)
        for i, d in enumerate(spec.datasets):
            ds = CorruptionDataset.model_validate(d.model_dump())
            require_tfds_name(source, i, ds.model_dump())
            if ds.corrupted in ("folder", "npy") and not ds.path:
                raise SpecError(
                    f"{source}: datasets.{i}.path: released {ds.corrupted} data needs its folder under "
                    f"--data-dir (dataset {ds.name!r})"
                )
            if not 0 < ds.crop_pct <= 1:
                raise SpecError(
                    f"{source}: datasets.{i}.crop_pct: {ds.crop_pct} is not in (0, 1] (dataset {ds.name!r})"
                )
        try:
            corruption_list(spec.hparams["corruptions"])
        except UserError as e:
            raise SpecError(f"{source}: hparams.corruptions: {e}") from None

    def training_images(self, cell) -> int:
        """Only the classifier stage fine-tunes; the corruption cells evaluate it."""
        return super().training_images(cell) if cell.stage == "classifier" else 0

    def extras(self, task) -> set[str]:
        """Generating corruptions needs imagecorruptions-imaug (the `corruptions` extra)."""
        kinds = {CorruptionDataset.model_validate(d.model_dump()).corrupted for d in task.datasets}
        return {"corruptions"} if "generate" in kinds else set()

    def check_data(self, task, ctx) -> None:
        """Before any cell: every dataset's clean splits open, released corrupted data is present (its first
        and last corruption at severities 1 and 5), and generation has its package."""
        from ..data.tfds_source import data_dir

        for hp in task.grid():
            corruption_list(hp["corruptions"])
        problems = []
        for spec in task.datasets:
            ds = CorruptionDataset.model_validate(spec.model_dump()).model_dump()
            try:
                open_clean(ds, ds["test"], ctx.data_dir)
                if ds["train"]:
                    open_clean(ds, ds["train"], ctx.data_dir)
            except DataMissingError as e:
                problems.append(f"{ds['name']} clean: {e}")
                continue
            if ds["corrupted"] == "generate":
                generator_identity()
                continue
            try:
                for c, s in ((CORRUPTIONS[0], 1), (CORRUPTIONS[-1], 5)):
                    open_released(ds, c, s, ctx.data_dir)
            except DataMissingError as e:
                how = {
                    "folder": f"download ImageNet-C (https://zenodo.org/record/2235448) and untar it so that "
                    f"{released_path(ds, ctx.data_dir)} follows {LAYOUT}",
                    "npy": f"download CIFAR-10-C (https://zenodo.org/record/2535967) into "
                    f"{released_path(ds, ctx.data_dir)}",
                    "tfds": f"prepare {ds['tfds_corrupted']} with tfds under {data_dir(ctx.data_dir)}",
                }[ds["corrupted"]]
                problems.append(
                    f"{ds['name']}: {str(e).split(';')[0]}; {how} (or score corruptions generated here: "
                    f"a dataset entry with `corrupted: generate`, e.g. imagenet2012_generated)"
                )
        if problems:
            raise UserError(
                f"robustness data missing: {' | '.join(problems)}; or try `--suite embedded`, which "
                f"needs no download (generating corruptions needs {INSTALL})"
            )

    def plan(self, task, backbone, results):
        cells = []
        for ds in task.datasets:
            for hp in task.grid():
                names = corruption_list(hp["corruptions"])
                base = {k: v for k, v in hp.items() if k != "corruptions"}
                for seed in task.seeds:
                    clf = make_cell(task, ds, backbone, base, seed, "classifier", report=REPORT)
                    cells.append(clf)
                    rec = results.store.get(clf)
                    if rec is not None and rec["status"] == "ok":
                        cells += [
                            make_cell(task, ds, backbone, {**base, "corruption": c}, seed, "corruption", report=REPORT)
                            for c in names
                        ]
        return cells

    def run(self, cell, ctx):
        hp, ds = CorruptionSettings.of(cell.hparams), entry(cell)
        started = time.time()
        model, info = classifier(cell, ctx)
        res = hp.resolution
        choice = for_forward(hp.bf16, ctx.device, model, hp.eval_batch, res)
        use_bf16 = choice.bf16
        if "bf16" in info:  # what the fine-tuning ran in; evaluation decides for itself
            info = {**{k: v for k, v in info.items() if k not in ("bf16", "bf16_choice")}, "train_bf16": info["bf16"]}
        info = {**info, "bf16": use_bf16, "bf16_choice": choice.info}
        if cell.stage == "classifier":
            if ds["corrupted"] == "generate":
                data, hit = generated(ds, cell.data_version, hp, "clean", 0, ctx)
                err = top1_error(model, data, hp, ctx, use_bf16)
            else:
                data, hit = open_clean(ds, ds["test"], ctx.data_dir), None
                err = top1_error(model, data, hp, ctx, use_bf16, resize_small=round(res / ds["crop_pct"]))
            return {
                "test": {"error": err, "accuracy": 100.0 - err},
                "info": {
                    **info,
                    "eval_examples": len(data),
                    "image_cache_hit": hit,
                    "seconds_total": round(time.time() - started, 2),
                },
            }
        corruption = hp.corruption
        errors, hits, n = {}, [], 0
        gen_seconds = 0.0
        for s in (1, 2, 3, 4, 5):
            t0 = time.time()
            if ds["corrupted"] == "generate":
                data, hit = generated(ds, cell.data_version, hp, corruption, s, ctx)
                hits.append(hit)
            else:
                data = open_released(ds, corruption, s, ctx.data_dir)
            gen_seconds += time.time() - t0
            errors[f"error_{s}"] = top1_error(model, data, hp, ctx, use_bf16)
            n = len(data)
        mean = float(np.mean(list(errors.values())))
        return {
            "test": {"error": mean, "accuracy": 100.0 - mean, **errors},
            "info": {
                **{k: v for k, v in info.items() if k.startswith("classifier")},
                "bf16": use_bf16,
                "bf16_choice": choice.info,
                "eval_examples_per_severity": n,
                "image_cache_hits": hits,
                "image_seconds": round(gen_seconds, 2),
                "seconds_total": round(time.time() - started, 2),
            },
        }
