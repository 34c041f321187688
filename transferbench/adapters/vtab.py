"""VTAB-1k fine-tuning (DPN §6.1 + App. E; scenic's VTAB config), the 19 tasks of tasks/vtab.yaml and
the embedded mini-suite, with one protocol:

    stage 'select': for each learning rate in the sweep and each seed, fine-tune on train800 and
                    measure val200 accuracy;
    stage 'final':  at the learning rate with the best mean val accuracy, fine-tune on
                    train800 + val200 and measure test accuracy, per seed.

Fine-tuning: a new zero-initialised head, SGD with momentum, no weight decay, gradient clipping,
linear warm-up then cosine to 0, per-task augmentation, images resized to the resolution (position
embeddings are resized to its grid). Every number is a hyper-parameter of the spec, overridable with
`--set`, and the record holds what was used.

Data: tfds datasets through `tfds.data_source` (`--data-dir`, $TFDS_DATA_DIR, ~/tensorflow_datasets),
or a folder written by `transferbench data export-vtab` when `--data-dir` points at one, or the
embedded sets.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from ..data.sources import DatasetEntry
from ..data.transforms import AUGMENTATIONS
from ..engine.train import BF16_SETTINGS
from . import Adapter, plan_select_then_final


class VtabDataset(DatasetEntry):
    val: str
    classes: int
    label: str = "label"  # a rule of transferbench.data.vtab.LABEL_RULES
    augment: Literal[AUGMENTATIONS] = "crop_flip"  # type: ignore[valid-type]


class ClassificationDataset(VtabDataset):
    """A VTAB-style entry for protocols without selection (high-res fine-tune, diagnostics): `val` unused."""
    val: str | None = None  # type: ignore[assignment]


def classification_entry(name: str, fields: dict) -> dict:
    """A ClassificationDataset entry with the schema's defaults filled in."""
    return ClassificationDataset.model_validate({**fields, "name": name}).model_dump()


def validate_entries(spec, source: str) -> None:
    """What the schema cannot say about VTAB-style entries (VTAB, high-res, diagnostics): a tfds dataset names
    its tfds builder, and the label rule exists."""
    from ..data.vtab import LABEL_RULES
    from .spec import SpecError
    for i, ds in enumerate(spec.datasets):
        d = ds.model_dump()
        if d.get("source", "tfds") == "tfds" and not d.get("tfds"):
            raise SpecError(f"{source}: datasets.{i}.tfds: a tfds dataset needs its tfds name (dataset {ds.name!r})")
        if d.get("label", "label") not in LABEL_RULES:
            raise SpecError(f"{source}: datasets.{i}.label: unknown rule {d['label']!r}; rules: "
                            f"{', '.join(LABEL_RULES)} (dataset {ds.name!r})")


def require_splits(task, ctx, what: str, roles=("train", "test")) -> None:
    """Before any cell of a protocol on ClassificationDataset entries (high-res, diagnostics): every dataset's
    `roles` open, or one line names the missing datasets, where they were looked for and how to prepare them."""
    from ..data.sources import missing as find_missing
    from ..data.tfds_source import data_dir
    from ..errors import UserError

    entries = [classification_entry(ds.name, ds.model_dump()) for ds in task.datasets]
    missing = find_missing(entries, lambda e: list(roles), opener=lambda e, role: open_split(e, role, ctx.data_dir))
    if missing:
        raise UserError(
            f"{what} data missing for {len(missing)} of {len(task.datasets)} datasets ({', '.join(missing)}): "
            f"searched {data_dir(ctx.data_dir)} (from --data-dir, else $TFDS_DATA_DIR, else ~/tensorflow_datasets) "
            "for prepared tfds data (imagenet2012 needs the manual download: tfds.builder('imagenet2012')"
            ".download_and_prepare() with the tars in its manual dir) or an export-vtab folder; or try "
            "`--suite embedded`, which needs no download")


class Joined(torch.utils.data.Dataset):
    """train800 + val200 of an image folder, keeping the folder's fast decoded-array access."""

    def __init__(self, parts):
        self.parts = parts
        self.labels = np.concatenate([p.labels for p in parts])
        self.num_classes = parts[0].num_classes

    def __len__(self) -> int:
        return len(self.labels)

    def array(self) -> np.ndarray:
        return np.concatenate([p.array() for p in self.parts])


def config(name: str, fields: dict) -> dict:
    """A dataset entry with the schema's defaults filled in (source tfds, label rule 'label', ...)."""
    return VtabDataset.model_validate({**fields, "name": name}).model_dump()


def is_export(data_dir, name: str) -> bool:
    """A folder written by `transferbench data export-vtab` (as opposed to a tfds data dir)."""
    return data_dir is not None and (Path(data_dir).expanduser() / name / "train800.txt").is_file()


def open_split(ds: dict, role: str, data_dir=None):
    """The dataset of role train | val | trainval | test for a resolved dataset config."""
    from ..data import sources, vtab
    from ..data.folder import FolderDataset

    roles = ("train", "val") if role == "trainval" else (role,)
    if ds["source"] == "tfds" and is_export(data_dir, ds["name"]):  # export-vtab wrote train800 / val200 / test
        folder = {"train": "train800", "val": "val200", "test": "test"}
        parts = [FolderDataset(Path(data_dir).expanduser(), ds["name"], folder[r]) for r in roles]
    elif ds["source"] == "embedded":
        parts = [sources.open_split(ds, ds[r]) for r in roles]
    else:
        return sources.open_split(ds, "+".join(ds[r] for r in roles), data_dir, vtab.LABEL_RULES[ds["label"]])
    return parts[0] if len(parts) == 1 else Joined(parts)


class VtabAdapter(Adapter):
    name = "vtab"
    dataset_schema = VtabDataset
    hparam_choices = {"optimizer": ("sgd",), "bf16": BF16_SETTINGS}

    def validate(self, spec, source="<spec>"):
        super().validate(spec, source)
        validate_entries(spec, source)

    def check_data(self, task, ctx) -> None:
        """Before any cell: every dataset's splits open, or one line says what is missing and where."""
        from ..data.sources import missing as find_missing
        from ..data.tfds_source import data_dir
        from ..errors import UserError

        entries = [config(ds.name, ds.model_dump()) for ds in task.datasets]
        missing = find_missing(entries, lambda e: ["train", "val", "test"],
                               opener=lambda e, role: open_split(e, role, ctx.data_dir))
        if missing:
            where = data_dir(ctx.data_dir)
            raise UserError(
                f"VTAB data missing for {len(missing)} of {len(task.datasets)} tasks ({', '.join(missing)}): searched "
                f"{where} (from --data-dir, else $TFDS_DATA_DIR, else ~/tensorflow_datasets) for prepared tfds data "
                "and for an export-vtab folder; prepare them with tfds (pip install 'transferbench[tfds]'; "
                "tfds.builder(NAME).download_and_prepare()) or run `transferbench data export-vtab --out DIR` where "
                "they are prepared and pass --data-dir DIR; or try `--suite embedded`, which needs no download")

    def plan(self, task, backbone, results):
        return plan_select_then_final(task, backbone, results)

    def run(self, cell, ctx):
        from ..data.transforms import eval_transform
        from ..engine.train import accuracy

        hp, ds = cell.hparams, config(cell.dataset, cell.dataset_config)
        final = cell.stage == "final"
        train = open_split(ds, "trainval" if final else "train", ctx.data_dir)
        evaluate_on = open_split(ds, "test" if final else "val", ctx.data_dir)
        model, info = finetune(cell, train, ds["classes"], ds["augment"], ctx)
        acc = accuracy(model, evaluate_on, eval_transform(hp["resolution"]), ctx.device, info["bf16"],
                       workers=ctx.workers)
        return {("test" if final else "val"): {"accuracy": acc},
                "info": {**info, "eval_examples": len(evaluate_on)}}


def finetune(cell, train, classes: int, augment: str, ctx, desc: str = "", *, keep_head: bool = False,
             on_step=None):
    """The VTAB fine-tuning recipe on `train` for `cell` (its backbone, checkpoint, seed and hyper-parameters:
    optimizer sgd, lr, momentum, weight_decay, batch, steps, warmup_steps, clip, resolution, bf16): a new
    zero-initialised head of `classes` (with `keep_head`, the checkpoint's own head where it has `classes`
    outputs), SGD with momentum, warm-up then cosine, clipping, `augment`; the position embeddings are resized
    to the resolution's grid and DTN's grid factors rebuilt for it. `on_step(model, step)` sees each step's
    complete gradients (engine.train.fit). Returns (model, info); other adapters that need a fine-tuned
    classifier (robustness, high-res, diagnostics) call it too."""
    from ..backbones import create_backbone
    from ..backbones.checkpoint import head_classes
    from ..data.transforms import train_transform
    from ..engine.train import cross_entropy, fit, train_batches

    hp = cell.hparams
    torch.manual_seed(cell.seed)
    head_kept = keep_head and cell.checkpoint is not None and head_classes(cell.checkpoint) == classes
    model = create_backbone(cell.backbone.partition("@")[0], img_size=hp["resolution"], checkpoint=cell.checkpoint,
                            num_classes=classes if head_kept else 0)
    if not head_kept:
        model.reset_classifier(classes)  # a new zero-initialised head, whatever the checkpoint had
    model.to(ctx.device)
    if hp["optimizer"] != "sgd":
        raise ValueError(f"optimizer {hp['optimizer']!r}: the VTAB protocol uses sgd")
    opt = torch.optim.SGD(model.parameters(), lr=hp["lr"], momentum=hp["momentum"], weight_decay=hp["weight_decay"])
    batches = train_batches(train, train_transform(hp["resolution"], augment), batch=hp["batch"], steps=hp["steps"],
                            seed=cell.seed, workers=ctx.workers)
    started = time.time()
    out = fit(model, batches, opt, steps=hp["steps"], base_lr=hp["lr"], warmup=hp["warmup_steps"], clip=hp["clip"],
              loss_fn=cross_entropy, device=ctx.device, bf16=hp.get("bf16", "auto"), micro_batch=ctx.micro_batch,
              progress=ctx.progress, desc=desc or f"{cell.dataset} lr={hp['lr']} seed={cell.seed}",
              on_step=None if on_step is None else (lambda step: on_step(model, step)))
    train_seconds = time.time() - started
    return model, {**out, "train_examples": len(train), "head": "checkpoint" if head_kept else "new", "train_seconds": round(train_seconds, 2),
                   "images_per_second": round(hp["steps"] * hp["batch"] / max(train_seconds, 1e-9), 1)}
